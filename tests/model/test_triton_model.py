"""The tiny models run on the Triton kernels (interpreted on a CPU) give the logits
they give on the plain-torch references: prefill, a chunk carrying state, batched
and single decodes."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # before any triton.jit runs

from ckptd.kernels import dispatch  # noqa: E402
from ckptd.model.loader import load_model  # noqa: E402
from ckptd.model.testing import Scratch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 2e-5 if DEVICE == "cpu" else 1e-4     # measured on the CPU: 3e-6 on logits of ~3


def _tokens(n, seed):
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _run(model) -> torch.Tensor:
    a, b = _tokens(40, 1), _tokens(13, 2)
    s = Scratch(model, block_size=16, max_tokens=48, n_seqs=2)
    steps = [
        s.feed({0: a[:25], 1: b}, all_logits=True),    # two prefills in one step
        s.feed({0: a[25:]}, all_logits=True),          # a chunk on top of cached state
        s.feed({0: [5], 1: [9]}),                      # batched decode
        s.feed({1: [3]}),                              # single decode
    ]
    return torch.cat(steps)


def _nan_filled(make):
    """torch.empty that fills floats with NaN: an unwritten output shows in the logits."""
    def wrapped(*args, **kwargs):
        t = make(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t
    return wrapped


def test_model_on_triton_kernels_equals_references(tiny_dir, monkeypatch):
    _compare(tiny_dir, monkeypatch)


def test_moe_model_on_triton_kernels_equals_references(tiny_moe_dir, monkeypatch):
    """With the grouped-GEMM expert kernel, where a step's few tokens leave experts idle."""
    _compare(tiny_moe_dir, monkeypatch)


@pytest.mark.parametrize("arch", ["nemotron_h", "falcon_h1", "mamba2", "jamba"])
def test_state_space_model_on_triton_kernels_equals_references(ssm_dirs, arch, monkeypatch):
    """Mamba2's chunked and step-by-step scans (attention without rotary, beside it,
    none), Mamba's selective scan, the conv with its bias. (Granite-4.0-H adds only the
    MoE kernel, which the Qwen MoE model runs above.)"""
    _compare(ssm_dirs[arch], monkeypatch)


def test_sliding_window_model_on_triton_kernels_equals_references(hf_dirs, monkeypatch):
    """Gemma 3: windowed attention (16 keys) beside global layers, qk norms, GELU."""
    _compare(hf_dirs["gemma3"], monkeypatch)


def test_gpt_oss_on_triton_kernels_equals_references(hf_dirs, monkeypatch):
    """gpt-oss: sinks in the Triton attention, windowed (16 keys) and full, biased q/k/v."""
    _compare(hf_dirs["gpt_oss"], monkeypatch)


def _compare(model_dir, monkeypatch):
    model = load_model(model_dir, device=DEVICE)
    monkeypatch.setattr(torch, "empty", _nan_filled(torch.empty))
    monkeypatch.setattr(torch, "empty_like", _nan_filled(torch.empty_like))
    monkeypatch.setattr(dispatch, "MODE", "torch")
    want = _run(model)
    monkeypatch.setattr(dispatch, "MODE", "triton")
    got = _run(model)
    assert got.shape == want.shape == (40 + 13 + 2 + 1, model.config.vocab_size)
    assert torch.isfinite(got).all()
    assert (got - want).abs().max().item() <= TOL

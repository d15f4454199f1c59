"""The tiny models run on the Triton kernels (interpreted on a CPU) give the logits
they give on the plain-torch references: prefill, a chunk carrying state, batched
and single decodes."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # before any triton.jit runs

from model.testing import Scratch  # noqa: E402

TOL = 2e-5     # measured: 3e-6 on logits of magnitude ~3


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


def test_model_on_triton_kernels_equals_references(tiny_model, monkeypatch):
    def nan_filled(make):
        def wrapped(*args, **kwargs):
            t = make(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t
        return wrapped

    monkeypatch.setattr(torch, "empty", nan_filled(torch.empty))
    monkeypatch.setattr(torch, "empty_like", nan_filled(torch.empty_like))
    monkeypatch.setenv("CKPTD_KERNELS", "torch")
    want = _run(tiny_model)
    monkeypatch.setenv("CKPTD_KERNELS", "triton")
    got = _run(tiny_model)
    assert got.shape == want.shape == (40 + 13 + 2 + 1, tiny_model.config.vocab_size)
    assert torch.isfinite(got).all()
    assert (got - want).abs().max().item() <= TOL

"""bfloat16 on the CPU keeps the central property: a restored cache gives the tokens of
no cache (greedy text equal on fixed prompts), and its logits stay within what bf16
allows of an uncached prefill.

The tolerance: bf16 keeps 8 significant bits (a relative step of 2^-8 = 0.4%), and a
restore computes the suffix in another step than an uncached prefill does, so matmuls
of other shapes round differently; over the tiny models' layers the last logits then
differ by up to a few hundredths (measured: 0.008 hybrid, 0.016 llama, on logits up to
~3; one or two bf16 steps of the logit). LOGIT_TOL (0.05 x the largest logit's magnitude,
at least 1) holds them; an off-by-one position or a wrong state gives differences of
the order of the logits themselves.
"""

from __future__ import annotations

import pytest
import torch

from ckptd.model.loader import load_model
from ckptd.model.testing import prompt_logits
from ckptd.model.text.tokenizer import Tokenizer
from tests.daemon.engines import check_cached_equals_uncached, restored_last_logits
from tests.daemon.engines import make_engine as _make

B, INTERVAL = 8, 32
LOGIT_TOL = 0.05
PROMPTS = [list(range(10, 10 + 70)), list(range(10, 10 + 70)) + [5, 6, 7],
           list(range(10, 10 + 40)) + [300, 301], [7] * 9 + list(range(200, 260))]


def _engine(model, path, tok, **kw):
    return _make(model, tok, path, block_size=B, interval=INTERVAL, snapshot_budget=1000.0,
                 **kw)


@pytest.fixture(scope="module", params=["qwen3_5_text", "llama"])
def bf16(request, tiny_hybrid_dir, tiny_llama_dir):
    path = tiny_hybrid_dir if request.param == "qwen3_5_text" else tiny_llama_dir
    return path, load_model(path, torch.bfloat16)


def test_bf16_cached_equals_uncached_greedy(bf16, tmp_path):
    path, model = bf16
    assert model.dtype == torch.bfloat16 and model.state_spec(B).attention.dtype == torch.bfloat16
    tok = Tokenizer.from_dir(path)
    check_cached_equals_uncached(lambda p, **kw: _engine(model, p, tok, **kw), tmp_path,
                                 PROMPTS, max_tokens=8)


def test_bf16_restored_logits_within_tolerance(bf16, tmp_path):
    path, model = bf16
    tok = Tokenizer.from_dir(path)
    prompt, longer = PROMPTS[0], PROMPTS[1]
    want = prompt_logits(model, longer)[-1].float()
    got, info = restored_last_logits(lambda p, **kw: _engine(model, p, tok, **kw), tmp_path,
                                     prompt, longer, restart=True)
    assert info.cached_tokens == 70 and info.tier == "disk"
    diff = (got - want).abs().max().item()
    assert diff <= LOGIT_TOL * max(1.0, want.abs().max().item()), diff
    assert got.argmax() == want.argmax()


def test_serve_device_cpu_dtype_bf16_cached_equals_uncached(tiny_hybrid_dir, tmp_path):
    """The daemon itself with --device cpu --dtype bfloat16: the same greedy text with
    the cache off, filling it, served from RAM, and after a restart from disk."""
    from tests.daemon.daemon_proc import start

    args = ("--device", "cpu", "--dtype", "bfloat16", "--snapshot-interval", "32",
            "--max-context", "512")

    def texts(d, cache: bool) -> list[tuple[str, int]]:
        out = []
        for p in PROMPTS:
            r = d.post("/v1/completions", {"prompt": p, "max_tokens": 8, "temperature": 0,
                                           "ignore_eos": True, "cache": cache})
            assert r.status == 200, r.text
            out.append((r.json["choices"][0]["text"],
                        r.json["usage"]["prompt_tokens_details"]["cached_tokens"]))
        return out

    d = start(tiny_hybrid_dir, tmp_path / "cache", *args)
    try:
        want = texts(d, cache=False)
        first, second = texts(d, cache=True), texts(d, cache=True)
    finally:
        assert d.stop() == 0, d.output()
    assert "on cpu bfloat16" in d.output()
    d = start(tiny_hybrid_dir, tmp_path / "cache", *args)
    try:
        third = texts(d, cache=True)
    finally:
        assert d.stop() == 0, d.output()
    assert [t for t, _ in want] == [t for t, _ in first] == [t for t, _ in second] \
        == [t for t, _ in third]
    assert all(n > 0 for _, n in second) and all(n > 0 for _, n in third)

"""The cache over kept weights: a tiny Qwen3.5 hybrid quantized by llama-quantize
(Q4_K_M with Q5_K / Q8_0 / Q4_0 / Q4_1 tensors, tests/data/quant/) and the same
architecture converted to Q8_0 by llama.cpp's converter serve with cached == uncached
(RAM hits and restarts from disk), restored logits within 1e-4 of an uncached
prefill (kept matmuls of a 3-token step and a 73-token step sum in other orders)."""

from __future__ import annotations

import pytest

from ckptd.model.loader import load
from ckptd.model.testing import prompt_logits
from tests.daemon.engines import check_cached_equals_uncached, restored_last_logits
from tests.daemon.test_engine import make_engine
from tests.kernels.quant_data import FIXTURE


@pytest.fixture(scope="module", params=["q4_k_mix", "q8_0"])
def kept_hybrid(request, tiny_hybrid_dir, tmp_path_factory):
    if request.param == "q4_k_mix":
        path = FIXTURE
    else:
        from ckptd.tools.make_tiny import to_gguf
        path = to_gguf(tiny_hybrid_dir, tmp_path_factory.mktemp("q8") / "q8_0.gguf", "q8_0")
    model, tok = load(path, weights="keep")
    assert model.fingerprint != load(path, weights="expand")[0].fingerprint
    return model, tok


def _make(model, tok):
    return lambda path, **kw: make_engine(model, path, tok, **kw)


def test_kept_hybrid_cached_equals_uncached(kept_hybrid, tmp_path):
    model, tok = kept_hybrid
    base = list(range(3, 3 + 45))
    prompts = [base + [400 + i] * i for i in (1, 3, 7)] + [base[:20] + [9, 9]]
    check_cached_equals_uncached(_make(model, tok), tmp_path, prompts)


def test_kept_hybrid_restored_logits_match_uncached(kept_hybrid, tmp_path):
    model, tok = kept_hybrid
    prompt = list(range(10, 10 + 70))
    longer = prompt + [5, 6, 7]
    got, info = restored_last_logits(_make(model, tok), tmp_path, prompt, longer, False)
    assert info.cached_tokens == 70
    assert (got - prompt_logits(model, longer)[-1]).abs().max() <= 1e-4

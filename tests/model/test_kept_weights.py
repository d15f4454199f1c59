"""`--weights keep` against `--weights expand` on the same GGUF: SmolLM2's Q4_1 / Q8_0
file gives the same greedy text on fixed prompts and logits within 2e-3 (the kept
matmuls sum in another order; measured max |diff| ~5e-5 on logits of magnitude ~20),
with its layers, lm_head and embedding really kept; the fingerprint tells the modes
apart; an unsupported tensor type is refused before any weight is read, naming it."""

from __future__ import annotations

import struct

import pytest
import torch

from ckptd.model.default import default_model_path
from ckptd.model.fingerprint import model_fingerprint
from ckptd.model.loader import load, load_model
from ckptd.model.quant import KeptEmbedding, KeptLinear
from ckptd.model.testing import Scratch, prompt_logits
from tests.kernels.quant_data import FIXTURE

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "List three prime numbers."]
TOL = 2e-3


@pytest.fixture(scope="module")
def smollm2():
    kept, tok = load(default_model_path(), weights="keep")
    expanded, _ = load(default_model_path(), weights="expand")
    return kept, expanded, tok


def _greedy(model, ids: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    s = Scratch(model, 16, len(ids) + n + 16)
    logits = s.feed({0: ids})
    out = []
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = s.feed({0: [out[-1]]})
    return out, logits


def test_smollm2_kept_is_really_kept(smollm2):
    kept, expanded, _ = smollm2
    linears = [m for m in kept.modules() if isinstance(m, KeptLinear)]
    assert len(linears) == 30 * 7 + 1                      # every projection + lm_head
    assert {m.qweight.fmt for m in linears} == {"Q4_1", "Q8_0"}
    assert isinstance(kept.model.embed_tokens, KeptEmbedding)
    head, embd = kept.lm_head.qweight.data, kept.model.embed_tokens.qweight.data
    assert head.data_ptr() == embd.data_ptr()                # tied: one copy, the file's
    assert kept.fingerprint != expanded.fingerprint
    assert expanded.fingerprint == model_fingerprint(expanded.config, [default_model_path()],
                                                     torch.float32)   # caches made before


@pytest.mark.parametrize("prompt", PROMPTS)
def test_smollm2_kept_matches_expanded(smollm2, prompt):
    kept, expanded, tok = smollm2
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}]))
    a, b = prompt_logits(kept, ids), prompt_logits(expanded, ids)
    assert (a - b).abs().max() < TOL
    (ta, la), (tb, lb) = _greedy(kept, ids, 8), _greedy(expanded, ids, 8)
    assert ta == tb, (tok.decode(ta), tok.decode(tb))
    assert (la - lb).abs().max() < TOL                     # decode steps: the gemv path


def _retype(src, dst, name: str, type_id: int) -> None:
    """A copy of a GGUF whose tensor `name` claims GGML type `type_id` (header only)."""
    data = bytearray(src.read_bytes())
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, type_id)
    dst.write_bytes(bytes(data))


def test_unsupported_type_is_refused_naming_the_tensor(tmp_path):
    bad = tmp_path / "q5_0.gguf"
    _retype(FIXTURE, bad, "blk.0.ffn_gate.weight", 6)      # Q4_0 -> Q5_0
    with pytest.raises(ValueError) as e:
        load_model(bad, weights="keep")
    msg = str(e.value)
    assert "'blk.0.ffn_gate.weight'" in msg and "Q5_0" in msg and "\n" not in msg
    load_model(bad, weights="expand")          # the gguf package dequantizes Q5_0


def test_weights_mode_is_checked():
    with pytest.raises(ValueError, match="weights must be one of"):
        load_model(FIXTURE, weights="pack")


def test_hybrid_out_proj_stays_kept_with_its_input_permuted():
    """Qwen3.5's out_proj is stored with its value-head columns tiled for ggml (2 key
    heads, 4 value heads here): a column permutation, not a row selection. It stays in
    its Q4_K bytes (no fp32 copy: 30 such layers of the 35B-A3B would be ~1 GB) and
    computes what the expanded weight does."""
    kept, expanded = load_model(FIXTURE, weights="keep"), load_model(FIXTURE, weights="expand")
    attn = kept.model.layers[0].linear_attn
    assert isinstance(attn.out_proj, KeptLinear) and attn.out_proj.qweight.fmt == "Q4_K"
    idx = attn.out_proj.in_index
    assert idx is not None and not torch.equal(idx, torch.arange(idx.numel()))
    x = torch.randn(5, attn.out_proj.in_features, generator=torch.Generator().manual_seed(0))
    want = x @ expanded.model.layers[0].linear_attn.out_proj.weight.T
    assert (attn.out(x) - want).abs().max() < 1e-4
    ids = list(range(3, 90))
    assert (prompt_logits(kept, ids) - prompt_logits(expanded, ids)).abs().max() < TOL

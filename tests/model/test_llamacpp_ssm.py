"""The state space hybrids converted to GGUF by llama.cpp's own convert_hf_to_gguf.py
load with the weights and logits of the Hugging Face folders they came from, and with
transformers' logits, in fp32; and with weights kept as stored."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from ckptd.model.config import ModelConfig
from ckptd.model.gguf.load import field, open_gguf
from ckptd.model.loader import load_model
from ckptd.model.testing import prompt_logits
from ckptd.model.text.tokenizer import load_tokenizer
from ckptd.tools.fetch_llamacpp import Conversion, convert
from tests.conftest import SSM_ARCHES

GGUF_ARCH = {"nemotron_h": ("nemotron_h", "nemotron_h_moe"), "granitemoehybrid":
             ("granitehybrid",), "falcon_h1": ("falcon-h1",), "mamba2": ("mamba2",),
             "jamba": ("jamba",)}
# kept weights: Q8_0 blocks (Nemotron-H: relu2 MLP, attention, Mamba2) and F16 (Jamba:
# its dt_proj is multiplied without its bias, then the bias in fp32)
KEPT = {"nemotron_h": "q8_0", "jamba": "f16"}
TOKENS = torch.randint(3, 512, (300,), generator=torch.Generator().manual_seed(4)).tolist()


@pytest.fixture(scope="session")
def ssm_ggufs(ssm_dirs, tmp_path_factory, llamacpp):
    """{(model_type, outtype): GGUF}, every one converted in one converter process."""
    out = tmp_path_factory.mktemp("llamacpp-ssm")
    cases = [(a, "f32") for a in SSM_ARCHES] + list(KEPT.items())
    files = {c: out / f"{c[0]}-{c[1]}.gguf" for c in cases}
    convert(llamacpp, [Conversion(ssm_dirs[a], files[a, t], t) for a, t in cases],
            tokenizer_pre="gpt-2")
    return files


@pytest.mark.parametrize("arch", SSM_ARCHES)
def test_converted_gguf_logits_match_folder(ssm_dirs, ssm_models, ssm_ggufs, arch):
    path = ssm_ggufs[arch, "f32"]
    assert field(open_gguf(path), "general.architecture") in GGUF_ARCH[arch]
    ours, want = load_model(path), ssm_models[arch]
    fields = [f for f in ModelConfig.__dataclass_fields__ if f not in ("raw", "dtype")]
    if arch in ("nemotron_h", "granitemoehybrid"):   # no rotary: the converter says 2^20
        fields.remove("max_position_embeddings")
    assert {f: getattr(ours.config, f) for f in fields} == \
        {f: getattr(want.config, f) for f in fields}
    assert ours.state_spec(16) == want.state_spec(16)
    # every weight in place (q/k rows unpermuted too, which attention without rotary
    # would not show in the logits; Falcon-H1's multipliers folded on both sides)
    mine, theirs = ours.state_dict(), want.state_dict()
    assert mine.keys() == theirs.keys()
    a, b = ours.config, want.config     # the GGUF's embedding and output scales folded
    scale = {"model.embed_tokens.weight": b.embedding_multiplier / a.embedding_multiplier,
             "lm_head.weight": b.logits_multiplier / a.logits_multiplier}
    for name, t in theirs.items():
        assert torch.allclose(mine[name], t * scale.get(name, 1.0), rtol=1e-5, atol=1e-6), name
    got = prompt_logits(ours, TOKENS)
    assert (got - prompt_logits(want, TOKENS)).abs().max().item() <= 1e-4
    # and transformers' own logits, from the folder the GGUF was converted from
    ref = AutoModelForCausalLM.from_pretrained(ssm_dirs[arch], dtype=torch.float32).eval()
    with torch.no_grad():
        hf = ref(input_ids=torch.tensor([TOKENS])).logits[0]
    assert (got - hf).abs().max().item() <= 1e-4
    assert ours.fingerprint != want.fingerprint
    tok, folder_tok = load_tokenizer(path), load_tokenizer(ssm_dirs[arch])
    text = "The quick brown fox: def add(a, b):\n    return a + b 東京"
    assert tok.encode(text) == folder_tok.encode(text)


def test_falcon_multipliers_are_folded_in_the_gguf(ssm_dirs, ssm_ggufs):
    """llama.cpp's converter folds Falcon-H1's multipliers into the weights: the GGUF's
    config is all 1.0, the folder's is not, and both compute the same (above)."""
    folder = json.loads((ssm_dirs["falcon_h1"] / "config.json").read_text())
    assert folder["key_multiplier"] != 1.0 and folder["ssm_multipliers"] != [1.0] * 5
    cfg = load_model(ssm_ggufs["falcon_h1", "f32"]).config
    assert (cfg.key_multiplier, cfg.ssm_in_multiplier, cfg.embedding_multiplier,
            cfg.logits_multiplier, cfg.ssm_multipliers) == (1.0, 1.0, 1.0, 1.0, (1.0,) * 5)


@pytest.mark.parametrize(("arch", "outtype"), list(KEPT.items()))
def test_kept_weights_compute_what_expanded_ones_do(ssm_ggufs, arch, outtype):
    from ckptd.model.quant import KeptLinear
    path = ssm_ggufs[arch, outtype]
    kept, expanded = load_model(path), load_model(path, weights="expand")
    mixer = next(layer.mamba for layer in kept.model.layers if layer.mamba is not None)
    assert isinstance(mixer.in_proj, KeptLinear) and isinstance(mixer.out_proj, KeptLinear)
    if arch == "jamba":
        assert isinstance(mixer.dt_proj, KeptLinear)
    got, want = prompt_logits(kept, TOKENS), prompt_logits(expanded, TOKENS)
    assert (got - want).abs().max().item() <= 1e-3
    assert kept.fingerprint != expanded.fingerprint

"""The MoE checkpoints transformers wrote (tests/model/moe_models.py), converted to
GGUF by llama.cpp's own convert_hf_to_gguf.py (qwen35moe, qwen3next), load with the
logits of their Hugging Face folders."""

from __future__ import annotations

import json

import gguf
import pytest
import torch

from ckptd.model.config import ModelConfig
from ckptd.model.gguf.load import field, open_gguf
from ckptd.model.loader import load_model
from ckptd.model.testing import prompt_logits
from ckptd.tools.fetch_llamacpp import Conversion, convert

# kind -> (GGUF architecture, converter flags): "moe" keeps its MTP layer in the GGUF
CASES = {"moe": ("qwen35moe", ()), "moe-nested": ("qwen35moe", ("--no-mtp",)),
         "next": ("qwen3next", ("--no-mtp",))}


@pytest.fixture(scope="session")
def moe_ggufs(moe_reference_dirs, tmp_path_factory, llamacpp):
    root = llamacpp
    out = tmp_path_factory.mktemp("llamacpp-moe")
    files = {kind: out / f"{kind}.gguf" for kind in CASES}
    jobs = [Conversion(moe_reference_dirs[k], files[k], "f32", CASES[k][1]) for k in CASES]
    files["next-q8"] = out / "next-q8.gguf"
    jobs.append(Conversion(moe_reference_dirs["next"], files["next-q8"], "q8_0", ("--no-mtp",)))
    # one converter process for all: its imports cost seconds
    convert(root, jobs, tokenizer_pre="gpt-2")
    return files


@pytest.mark.parametrize("kind", list(CASES))
def test_converted_moe_gguf_matches_folder(moe_reference_dirs, moe_ggufs, kind):
    folder, path = moe_reference_dirs[kind], moe_ggufs[kind]
    reader = open_gguf(path)
    assert field(reader, "general.architecture") == CASES[kind][0]
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == gguf.GGMLQuantizationType.F32
    assert "blk.0.ffn_gate_inp_shexp.weight" in types
    ours, want = load_model(path), load_model(folder)
    fields = [f for f in ModelConfig.__dataclass_fields__ if f not in ("raw", "dtype")]
    assert {f: getattr(ours.config, f) for f in fields} == \
        {f: getattr(want.config, f) for f in fields}
    tokens = torch.randint(3, 512, (300,), generator=torch.Generator().manual_seed(4)).tolist()
    got, ref = prompt_logits(ours, tokens), prompt_logits(want, tokens)
    assert (got - ref).abs().max().item() <= 1e-4
    assert ours.fingerprint != want.fingerprint


def test_mtp_layer_is_in_the_gguf_and_skipped(moe_ggufs):
    reader = open_gguf(moe_ggufs["moe"])
    assert field(reader, "qwen35moe.nextn_predict_layers") == 1
    assert field(reader, "qwen35moe.block_count") == 5
    assert any(t.name.startswith("blk.4.") for t in reader.tensors)
    assert load_model(moe_ggufs["moe"], gguf_reader=reader).config.num_layers == 4


def test_quantized_moe_gguf_dequantizes(moe_reference_dirs, moe_ggufs):
    """Q8_0 experts (the block format real MoE GGUFs ship) are dequantized when they are
    assigned, into the folder's values up to the format's rounding. (Logits are not
    compared: a rounded router can send a token to another expert.)"""
    path = moe_ggufs["next-q8"]
    types = {t.name: t.tensor_type for t in open_gguf(path).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == gguf.GGMLQuantizationType.Q8_0
    ours, want = load_model(path, weights="expand"), load_model(moe_reference_dirs["next"])
    for name in ("gate_up_proj", "down_proj"):
        a = getattr(ours.model.layers[0].mlp.experts, name)
        b = getattr(want.model.layers[0].mlp.experts, name)
        err = (a - b).abs().max().item()
        assert a.dtype == torch.float32 and 0 < err <= b.abs().max().item() / 100, name
    assert torch.isfinite(prompt_logits(ours, list(range(3, 60)))).all()
    # kept (the default): the experts stay Q8_0 and compute what the expanded ones do
    from ckptd.model.quant import KeptExperts
    kept = load_model(path)
    experts = kept.model.layers[0].mlp.experts
    assert isinstance(experts, KeptExperts) and experts.gate.fmt == "Q8_0"
    ids = list(range(3, 60))
    assert (prompt_logits(kept, ids) - prompt_logits(ours, ids)).abs().max() < 1e-3


def test_converted_config_keys(moe_ggufs):
    from ckptd.model.gguf.load import load_gguf
    cfg, tensors = load_gguf(moe_ggufs["next"])
    assert cfg["model_type"] == "qwen3_next" and cfg["num_experts"] == 8
    assert cfg["mlp_only_layers"] == [] and cfg["norm_topk_prob"] is True
    assert tensors["model.layers.0.mlp.experts.gate_up_proj"].shape == (8, 64, 64)
    assert tensors["model.layers.0.linear_attn.in_proj_ba.weight"].shape == (8, 64)
    json.dumps(cfg)                    # a plain config dict, like config.json


def test_big_gguf_writes_the_converters_layout(moe_ggufs, tmp_path):
    """tools/bench/big_gguf.py writes what llama.cpp's converter writes for the same
    Qwen3.5-MoE config: tensor names, order and shapes, and every qwen35moe.* key."""
    from ckptd.tools.bench.big_gguf import write
    from tests.model.moe_models import _MROPE, _TEXT

    ref_path = moe_ggufs["moe-nested"]          # converted with --no-mtp
    out = tmp_path / "written.gguf"
    write(out, {**_TEXT, "rope_parameters": _MROPE}, mix="Q8_0", tokenizer=ref_path)
    ref, got = open_gguf(ref_path), open_gguf(out)
    assert [(t.name, t.shape.tolist()) for t in got.tensors] == \
        [(t.name, t.shape.tolist()) for t in ref.tensors]
    arch = {k for k in ref.fields if k.startswith("qwen35moe.")}
    assert arch == {k for k in got.fields if k.startswith("qwen35moe.")}
    assert {k: field(got, k) for k in arch} == {k: field(ref, k) for k in arch}
    types = {t.name: t.tensor_type.name for t in got.tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == "Q8_0"
    assert types["blk.0.ffn_down_shexp.weight"] == "F16"     # rows of 48: not Q8_0 blocks
    assert load_model(out).config.num_layers == 4

"""gpt-oss against transformers, on a checkpoint transformers' own GptOssForCausalLM wrote
(make-tiny --arch gpt_oss: window layers of 16 keys alternating with full ones, sinks,
8 experts of which 2 a token, YaRN with its ramp untruncated). Prompts far longer than
the window, greedy decoding one token a step, the GGUF llama.cpp's converter writes, a
prompt fed in uneven chunks against the one-step logits, and the experts' clamped
SwiGLU where the clamps bite."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GptOssConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

from ckptd.kernels import ops
from ckptd.model.arch.gpt_oss import _split_gate_up_bias, _split_gate_up_weight
from ckptd.model.configs import config_from_hf
from ckptd.model.gguf.load import field, open_gguf
from ckptd.model.gpt_oss_config import GptOssConfig as OurConfig
from ckptd.model.loader import load_model
from ckptd.model.testing import prompt_logits
from ckptd.tools.fetch_llamacpp import Conversion, convert
from tests.model.reference import check_chunks_equal_one_step, check_greedy, check_prompt_logits


@pytest.fixture(scope="module")
def gpt_oss(hf_dirs, hf_models):
    return hf_dirs["gpt_oss"], hf_models["gpt_oss"]


def test_logits_and_greedy_match_transformers(gpt_oss):
    folder, ours = gpt_oss
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(ref).__name__ == "GptOssForCausalLM"
    cfg = ours.config
    assert isinstance(cfg, OurConfig) and cfg.sliding_window == 16
    assert cfg.layer_types == ("sliding_attention", "full_attention") * 2
    assert (cfg.rope_type, cfg.rope_factor, cfg.rope_truncate) == ("yarn", 32.0, False)
    tokens = check_prompt_logits(ref, ours, lengths=(1, 17, 40, 300))
    check_greedy(ref, ours, tokens[:40])


def test_the_gguf_llamacpp_writes_gives_transformers_logits(gpt_oss, llamacpp, tmp_path):
    """llama.cpp's converter splits the interleaved gate_up into ffn_gate_exps and
    ffn_up_exps, transposes the experts and leaves the layer pattern and YaRN's
    truncation to llama.cpp's defaults: the GGUF's logits are transformers', past the
    window."""
    folder, _ = gpt_oss
    path, half = tmp_path / "gpt-oss.gguf", tmp_path / "gpt-oss-f16.gguf"
    convert(llamacpp, [Conversion(folder, path, "f32"), Conversion(folder, half, "f16")],
            tokenizer_pre="gpt-2")
    assert field(open_gguf(path), "general.architecture") == "gpt-oss"
    ours = load_model(path)
    assert ours.config.layer_types == gpt_oss[1].config.layer_types
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    V = ours.config.vocab_size
    tokens = torch.randint(3, V, (120,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        want = ref(input_ids=torch.tensor([tokens])).logits[0, :, :V]
    assert (prompt_logits(ours, tokens) - want).abs().max().item() <= 1e-4
    # F16 under --weights keep: the linears stay F16 (kept), the experts are expanded
    kept = load_model(half)
    assert type(kept.model.layers[0].self_attn.q_proj).__name__ == "KeptLinear"
    assert (prompt_logits(kept, tokens) - want).abs().max().item() <= 1e-2


def test_chunks_and_packed_sequences_equal_one_step(gpt_oss):
    """Uneven chunks (crossing pages and windows), two sequences packed in one step and
    decodes beside a prefill: every logit equals the one-step prefill's."""
    check_chunks_equal_one_step(gpt_oss[1])


def test_the_experts_equal_transformers_where_the_clamps_bite():
    """Inputs large enough that gate passes the limit and up leaves [-limit, limit]:
    the grouped experts (transformers' layout turned into ours) equal GptOssExperts."""
    hf = GptOssExperts(GptOssConfig(hidden_size=32, intermediate_size=24, num_local_experts=5,
                                    num_experts_per_tok=2))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    x = torch.randn(40, 32, generator=g)
    ids = torch.stack([torch.randperm(5, generator=g)[:2] for _ in range(40)])
    w = torch.rand(40, 2, generator=g).softmax(-1)
    gate_up = x @ hf.gate_up_proj[0] + hf.gate_up_proj_bias[0]
    assert (gate_up[:, ::2] > 7).any() and (gate_up[:, 1::2].abs() > 7).any()
    with torch.no_grad():
        want = hf(x, ids, w)
        got = ops.moe_experts_clamped(
            x, ids, w, _split_gate_up_weight(hf.gate_up_proj), _split_gate_up_bias(
                hf.gate_up_proj_bias), hf.down_proj.transpose(-1, -2), hf.down_proj_bias,
            hf.alpha, hf.limit)
    assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()


def test_the_hubs_mxfp4_experts_are_refused_by_name(gpt_oss, tmp_path):
    """The Hub's gpt-oss folders pack the experts as MXFP4 (`*_blocks`, `*_scales`)."""
    folder, _ = gpt_oss
    tensors = load_file(folder / "model.safetensors")
    blocks = "model.layers.0.mlp.experts.gate_up_proj_blocks"
    tensors[blocks] = torch.zeros(8, 64, 2, 16, dtype=torch.uint8)
    del tensors["model.layers.0.mlp.experts.gate_up_proj"]
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(ValueError, match=f"{blocks} is MXFP4"):
        load_model(tmp_path)


def _hf_config(**over) -> dict:
    d = {"model_type": "gpt_oss", "vocab_size": 512, "hidden_size": 64,
         "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 8,
         "num_local_experts": 4, "num_experts_per_tok": 2}
    return {**d, **over}


def test_the_hubs_config_keys_are_read():
    """The released config.json: rope_scaling and rope_theta beside each other, no
    layer_types (windows first, every other)."""
    cfg = config_from_hf(_hf_config(rope_theta=150000, rope_scaling={
        "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 4096}))
    assert cfg.layer_types == ("sliding_attention", "full_attention")
    assert cfg.window(0) == 8 and cfg.window(1) == 0 and cfg.rope_theta == 150000
    inv_freq, factor = cfg.rotary()
    assert inv_freq.shape == (8,) and factor == pytest.approx(0.1 * torch.log(
        torch.tensor(32.0)).item() + 1)
    assert cfg.state_spec(16).attention.n_layers == 2
    assert json.dumps(cfg.raw)       # the config a snapshot's fingerprint reads


@pytest.mark.parametrize(("over", "says"), [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"sliding_window": None}, "sliding_window"),
    ({"layer_types": ["sliding_attention", "chunked"]}, "layer_types"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "rope type"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"num_local_experts": None}, "wrong type"),
])
def test_unsupported_configs_are_refused_by_name(over, says):
    with pytest.raises(ValueError, match=says):
        config_from_hf(_hf_config(**over))


def _mxfp4(shape, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 blocks [*shape, cols / 32, 16] and E8M0 scales [*shape, cols / 32]."""
    *rows, cols = shape
    blocks = torch.randint(0, 256, (*rows, cols // 32, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(121, 126, (*rows, cols // 32), generator=g, dtype=torch.uint8)
    return blocks, scales


def test_mxfp4_experts_in_the_gguf_are_dequantized_or_refused_by_name(gpt_oss, llamacpp,
                                                                       tmp_path):
    """A folder with the Hub's MXFP4 experts, converted by llama.cpp (which repacks them
    into GGUF MXFP4, the released GGUFs' format): `--weights expand` gives the logits of
    transformers' own dequantization (integrations.mxfp4), `keep` refuses by name."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    folder, ours = gpt_oss
    cfg = ours.config
    E, H, inter = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    tensors = load_file(folder / "model.safetensors")
    packed, plain = tmp_path / "packed", tmp_path / "plain"
    packed.mkdir()
    plain.mkdir()
    g = torch.Generator().manual_seed(5)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}.mlp.experts."
        for name, shape in (("gate_up_proj", (E, 2 * inter, H)), ("down_proj", (E, H, inter))):
            blocks, scales = _mxfp4(shape, g)
            tensors[p + name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
            tensors_packed = {p + name + "_blocks": blocks, p + name + "_scales": scales}
            tensors.update({f"packed:{k}": v for k, v in tensors_packed.items()})
    save_file({k: v for k, v in tensors.items() if not k.startswith("packed:")},
              plain / "model.safetensors")
    save_file({k.removeprefix("packed:"): v for k, v in tensors.items()
               if k.startswith("packed:") or not k.endswith(("gate_up_proj", "down_proj"))},
              packed / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    (plain / "config.json").write_text(json.dumps(config))
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (packed / "config.json").write_text(json.dumps(config))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (packed / f).write_text((folder / f).read_text())
    path = tmp_path / "mxfp4.gguf"
    convert(llamacpp, [Conversion(packed, path, "f32")], tokenizer_pre="gpt-2")
    kinds = {t.name: t.tensor_type.name for t in open_gguf(path).tensors}
    assert kinds["blk.0.ffn_gate_exps.weight"] == "MXFP4"
    with pytest.raises(ValueError, match="'blk.0.ffn_(gate|up|down)_exps.weight' has type MXFP4"):
        load_model(path)                                   # --weights keep
    got_model = load_model(path, weights="expand")
    ref = AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32).eval()
    tokens = torch.randint(3, 512, (60,), generator=g).tolist()
    with torch.no_grad():
        want = ref(input_ids=torch.tensor([tokens])).logits[0]
    got = prompt_logits(got_model, tokens)
    assert (got - want).abs().max().item() <= 1e-4 * max(1.0, want.abs().max().item())
    assert (prompt_logits(ours, tokens) - want).abs().max().item() > 1e-2

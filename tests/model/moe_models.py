"""Tiny random Qwen3.5-MoE / Qwen3-Next checkpoints written by transformers' own classes.

Each is built by its transformers class, given seeded weights of a useful scale (the
classes' 0.02 init makes near-uniform logits), saved with save_pretrained (the Hub's
layout: one tensor per expert, Qwen3-Next's fused in_proj_qkvz) and given make-tiny's
tokenizer, so llama.cpp's converter can turn it into a GGUF.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ckptd.tools.make_tiny import _tokenizer
from ckptd.tools.tiny_ssm import randomize

_TEXT = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
             linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
             linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
             moe_intermediate_size=32, shared_expert_intermediate_size=48,
             layer_types=["linear_attention"] * 3 + ["full_attention"], rms_norm_eps=1e-6,
             max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=0,
             eos_token_id=2)
# mrope_section counts rotary pairs per axis: 4 rotary dims are 2 pairs
_MROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
          "mrope_section": [1, 1, 0], "mrope_interleaved": True}

# name -> (transformers class, config builder); "next-dense" has a dense layer and
# unnormalised top-k weights (llama.cpp's converter has no dense qwen3next layer, so it
# has no GGUF)
KINDS = ("moe", "moe-nested", "next", "next-dense")


def _config(kind: str):
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeTextConfig, Qwen3NextConfig
    if kind == "moe":
        return Qwen3_5MoeTextConfig(**_TEXT, rope_parameters=_MROPE)
    if kind == "moe-nested":
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                      out_hidden_size=64, patch_size=4, num_position_embeddings=16)
        return Qwen3_5MoeConfig(text_config={**_TEXT, "rope_parameters": _MROPE},
                                vision_config=vision, tie_word_embeddings=False)
    rope = {k: v for k, v in _MROPE.items() if not k.startswith("mrope")}
    if kind == "next":
        return Qwen3NextConfig(**_TEXT, intermediate_size=96, rope_parameters=rope,
                               norm_topk_prob=True)
    return Qwen3NextConfig(**_TEXT, intermediate_size=96, rope_parameters=rope,
                           mlp_only_layers=[1], norm_topk_prob=False)


def _class(kind: str):
    from transformers import (
        Qwen3_5MoeForCausalLM,
        Qwen3_5MoeForConditionalGeneration,
        Qwen3NextForCausalLM,
    )
    return {"moe": Qwen3_5MoeForCausalLM, "moe-nested": Qwen3_5MoeForConditionalGeneration,
            "next": Qwen3NextForCausalLM, "next-dense": Qwen3NextForCausalLM}[kind]


def _zero_centred(name: str) -> bool:
    """Qwen3.5's norms keep weight - 1; its gated DeltaNet norm and the vision tower's
    keep the weight."""
    return not name.endswith("linear_attn.norm.weight") and "visual" not in name


def build(kind: str, out: Path, seed: int = 0) -> Path:
    """Write the `kind` checkpoint to out/ (config, safetensors, tokenizer)."""
    torch.manual_seed(seed)
    model = _class(kind)(_config(kind)).eval()
    randomize(model, seed, _zero_centred)
    model.save_pretrained(out)
    _tokenizer(out)
    return out


def add_mtp_layer(folder: Path) -> None:
    """Give a Qwen3.5-MoE text checkpoint one multi-token-prediction layer (mtp.*), as
    the released checkpoints have: a copy of its full-attention layer plus the fc and
    norms, under the names llama.cpp's converter maps to nextn tensors."""
    from safetensors.torch import load_file, save_file

    f = folder / "model.safetensors"
    w = load_file(f)
    src = "model.layers.3."
    g = torch.Generator().manual_seed(7)
    for name, t in list(w.items()):
        if name.startswith(src):
            w["mtp.layers.0." + name[len(src):]] = t + 0.01 * torch.randn(t.shape, generator=g)
    H = w["model.norm.weight"].shape[0]
    w["mtp.fc.weight"] = 0.1 * torch.randn(H, 2 * H, generator=g)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        w[f"mtp.{n}.weight"] = 0.1 * torch.randn(H, generator=g)
    save_file(w, f, metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["mtp_num_hidden_layers"] = 1
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))

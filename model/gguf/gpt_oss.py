"""gpt-oss from llama.cpp's `gpt-oss` GGUFs (convert_hf_to_gguf.py's GptOssModel), as a
transformers gpt_oss config and the model's tensors (arch/gpt_oss.py).

The converter splits transformers' interleaved gate_up_proj into ffn_gate_exps and
ffn_up_exps [E, I, H] (biases likewise), transposes down_proj into ffn_down_exps
[E, H, I], and names the sinks attn_sinks.weight. What it leaves out is what llama.cpp
assumes for gpt-oss: window layers first and every other (its swa pattern 2), and the
released config's YaRN without truncating the ramp's ends (`truncate` false). Expert
tensors in MXFP4 (the released GGUFs') are dequantized with the gguf package under
`--weights expand` and refused by name under `--weights keep` (gguf/kept.py).
"""

from __future__ import annotations

import torch

from ckptd.model.checkpoint import Recipe, plain
from ckptd.model.gguf.reader import (
    GGUFTensors,
    convert_tensors,
    field,
    need_field,
    require,
    scalar,
)

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = {
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate_inp": "mlp.router",
}
_EXPERTS = "mlp.experts."


def load_gpt_oss(reader, tensors: GGUFTensors) -> tuple[dict, dict[str, Recipe]]:
    cfg = _config(reader, tensors)
    n = cfg["num_hidden_layers"]
    require(tensors, ["token_embd.weight", "output_norm.weight"]
            + [f"blk.{i}.{p}" for i in range(n) for p in (
                *(f"{s}.weight" for s in _BLOCK), "attn_sinks.weight", "ffn_gate_exps.weight",
                "ffn_up_exps.weight", "ffn_down_exps.weight")])

    def block(i: int, part: str):
        stem, _, suffix = part.partition(".")
        name = f"blk.{i}.{part}"
        p = f"model.layers.{i}."
        if stem in _BLOCK:
            return [(f"{p}{_BLOCK[stem]}.{suffix}", plain(lambda: tensors.get(name)))]
        if part == "attn_sinks.weight":
            return [(p + "self_attn.sinks", plain(lambda: tensors.get(name)))]
        if stem == "ffn_up_exps":
            return []                       # read with ffn_gate_exps
        if stem == "ffn_gate_exps":
            key = _EXPERTS + ("gate_up_proj" if suffix == "weight" else "gate_up_proj_bias")
            return [(p + key, _gate_up(tensors, i, suffix))]
        if stem == "ffn_down_exps":
            key = _EXPERTS + ("down_proj" if suffix == "weight" else "down_proj_bias")
            return [(p + key, plain(lambda: tensors.get(name)))]
        return None

    out = convert_tensors(tensors, n, _TOP, block)
    cfg["tie_word_embeddings"] = "lm_head.weight" not in out
    return cfg, out


def _gate_up(tensors: GGUFTensors, i: int, suffix: str) -> Recipe:
    """ffn_gate_exps then ffn_up_exps stacked on their rows ([E, 2I, H] / [E, 2I])."""
    gate, up = f"blk.{i}.ffn_gate_exps.{suffix}", f"blk.{i}.ffn_up_exps.{suffix}"

    def get(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.cat([tensors.get(gate).to(device, dtype), tensors.get(up).to(device, dtype)],
                         dim=1)
    return get


def _config(reader, tensors: GGUFTensors) -> dict:
    a = "gpt-oss"

    def need(key: str):
        return need_field(reader, a, key)

    n = int(need("block_count"))
    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    cfg = {
        "model_type": "gpt_oss",
        "architectures": ["GptOssForCausalLM"],
        "vocab_size": int(tensors.shape("token_embd.weight")[0]),
        "hidden_size": hidden,
        "intermediate_size": int(need("expert_feed_forward_length")),
        "num_hidden_layers": n,
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(reader, f"{a}.attention.head_count_kv", heads)),
        "head_dim": int(field(reader, f"{a}.attention.key_length", hidden // heads)),
        "num_local_experts": int(need("expert_count")),
        "num_experts_per_tok": int(need("expert_used_count")),
        "rms_norm_eps": scalar(field(reader, f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
        "max_position_embeddings": int(field(reader, f"{a}.context_length", 131072)),
        "sliding_window": int(need("attention.sliding_window")),
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                        for i in range(n)],
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
    }
    rope = {"rope_theta": scalar(field(reader, f"{a}.rope.freq_base", 150000.0))}
    kind = str(field(reader, f"{a}.rope.scaling.type", "none"))
    if kind == "yarn":
        rope.update(rope_type="yarn", factor=scalar(need("rope.scaling.factor")),
                    original_max_position_embeddings=int(
                        need("rope.scaling.original_context_length")),
                    beta_fast=scalar(field(reader, f"{a}.rope.scaling.yarn_beta_fast", 32.0)),
                    beta_slow=scalar(field(reader, f"{a}.rope.scaling.yarn_beta_slow", 1.0)),
                    truncate=False)
        factor = field(reader, f"{a}.rope.scaling.yarn_attn_factor")
        if factor is not None:
            rope["attention_factor"] = scalar(factor)
    elif kind == "none":
        rope["rope_type"] = "default"
    else:
        raise ValueError(f"{a} GGUF: unsupported rope scaling {kind!r} (yarn is)")
    cfg["rope_parameters"] = rope
    return cfg

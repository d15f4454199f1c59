"""Gemma 3's text model from llama.cpp's `gemma3` GGUFs (convert_hf_to_gguf.py's
Gemma3Model), as a transformers gemma3_text config and its tensors.

What the converter changes is undone: every norm weight had 1 added (llama.cpp's norm
multiplies by w, Gemma's by 1 + w), so 1 is taken off. What it leaves out is what
llama.cpp assumes for gemma3: a global layer every sixth (`sliding_window_pattern` 6),
the attention scale head_dim ** -0.5 (n_embd / n_head for the 62-layer 27B: its
query_pre_attn_scalar), the local rotary base 10000 unless `rope.freq_base_swa` says.
The embedding keeps only the tokenizer's rows, so the vocabulary is its row count.
"""

from __future__ import annotations

from ckptd.model.checkpoint import Recipe, plain
from ckptd.model.gguf.reader import GGUFTensors, convert_tensors, field, require, scalar

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = {
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def load_gemma3(reader, tensors: GGUFTensors) -> tuple[dict, dict[str, Recipe]]:
    cfg = _config(reader, tensors)
    n = cfg["num_hidden_layers"]
    require(tensors, ["token_embd.weight", "output_norm.weight"]
            + [f"blk.{i}.{p}.weight" for i in range(n) for p in _BLOCK])

    def block(i: int, part: str):
        stem, _, suffix = part.partition(".")
        if stem not in _BLOCK:
            return None
        name = f"blk.{i}.{part}"
        shift = 1.0 if stem.endswith("norm") else 0.0
        return [(f"model.layers.{i}.{_BLOCK[stem]}.{suffix}",
                 plain(lambda: tensors.get(name) - shift))]

    out = convert_tensors(tensors, n, _TOP, block)
    norm = out["model.norm.weight"]
    out["model.norm.weight"] = lambda dtype, device: norm(dtype, device) - 1.0
    cfg["tie_word_embeddings"] = "lm_head.weight" not in out
    return cfg, out


def _config(reader, tensors: GGUFTensors) -> dict:
    a = "gemma3"

    def need(key: str):
        v = field(reader, f"{a}.{key}")
        if v is None:
            raise ValueError(f"{a} GGUF lacks the metadata key {a}.{key}")
        return v

    n = int(need("block_count"))
    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    head_dim = int(field(reader, f"{a}.attention.key_length", hidden // heads))
    cap = field(reader, f"{a}.final_logit_softcapping")
    cfg = {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "vocab_size": int(tensors.shape("token_embd.weight")[0]),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": n,
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(reader, f"{a}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": scalar(field(reader, f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(field(reader, f"{a}.context_length", 131072)),
        "sliding_window": int(need("attention.sliding_window")),
        "sliding_window_pattern": 6,
        "rope_theta": scalar(field(reader, f"{a}.rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": scalar(field(reader, f"{a}.rope.freq_base_swa", 10000.0)),
        "query_pre_attn_scalar": hidden // heads if n == 62 else head_dim,
        "final_logit_softcapping": None if cap is None else scalar(cap),
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
    }
    kind = str(field(reader, f"{a}.rope.scaling.type", "none"))
    if kind == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear",
                               "factor": scalar(need("rope.scaling.factor"))}
    elif kind != "none":
        raise ValueError(f"{a} GGUF: unsupported rope scaling {kind!r} (linear is)")
    return cfg

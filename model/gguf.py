"""Read a GGUF file: config, dequantized weights under Hugging Face names, tokenizer data.

Supported architectures: llama. GGUF stores llama's q/k projection rows permuted
for llama.cpp's interleaved rotary; they are permuted back to the rotate-half
layout the model (and transformers) uses.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

SUPPORTED = ("llama",)

_LLAMA_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LLAMA_BLOCK = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def open_gguf(path: str | Path):
    import gguf

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such GGUF file: {path}")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (bad magic)")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # the reader raises bare ValueError/IndexError on truncation
        raise ValueError(f"cannot read GGUF {path} (truncated or corrupt?): {e}") from None


def field(reader, name: str, default=None):
    f = reader.fields.get(name)
    return default if f is None else f.contents()


def load_gguf(path: str | Path, reader=None) -> tuple[dict, dict[str, torch.Tensor]]:
    """(Hugging Face style config dict, {HF tensor name: fp32 tensor})."""
    import gguf

    reader = reader or open_gguf(path)
    arch = field(reader, "general.architecture")
    if arch not in SUPPORTED:
        raise ValueError(f"unsupported GGUF architecture {arch!r} "
                         f"(supported: {', '.join(SUPPORTED)})")
    cfg = _llama_config(reader)
    tensors = {}
    for t in reader.tensors:
        name = _hf_name(t.name)
        if name is None:
            continue
        w = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type),
                                      dtype=np.float32))
        if name.endswith("q_proj.weight"):
            w = _unpermute(w, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = _unpermute(w, cfg["num_key_value_heads"])
        tensors[name] = w
    if "lm_head.weight" not in tensors:
        cfg["tie_word_embeddings"] = True
    return cfg, tensors


def _llama_config(reader) -> dict:
    a = "llama"
    heads = int(field(reader, f"{a}.attention.head_count"))
    hidden = int(field(reader, f"{a}.embedding_length"))
    tokens = reader.fields["tokenizer.ggml.tokens"]
    vocab = int(field(reader, f"{a}.vocab_size", len(tokens.data)))
    return {
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(field(reader, f"{a}.feed_forward_length")),
        "num_hidden_layers": int(field(reader, f"{a}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(reader, f"{a}.attention.head_count_kv", heads)),
        "head_dim": int(field(reader, f"{a}.rope.dimension_count", hidden // heads)),
        "rope_theta": float(field(reader, f"{a}.rope.freq_base", 10000.0)),
        "rms_norm_eps": float(field(reader, f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
        "max_position_embeddings": int(field(reader, f"{a}.context_length", 8192)),
        "tie_word_embeddings": False,
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
    }


def _hf_name(name: str) -> str | None:
    if name in _LLAMA_NAMES:
        return _LLAMA_NAMES[name]
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LLAMA_BLOCK:
        return f"model.layers.{parts[1]}.{_LLAMA_BLOCK[parts[2]]}.{parts[3]}"
    if name.startswith("rope_freqs"):
        return None
    raise ValueError(f"unexpected tensor {name!r} in llama GGUF")


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation: per head, rows are stored as interleaved
    (pair i = rows 2i, 2i+1); rotate-half wants row i and row i + d/2 paired."""
    rows = w.shape[0]
    d = rows // n_heads
    return w.reshape(n_heads, d // 2, 2, -1).transpose(1, 2).reshape(rows, -1)

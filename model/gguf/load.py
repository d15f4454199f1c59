"""Read a GGUF file: a Hugging Face style config, weights under Hugging Face names,
and the tokenizer.

    config, recipes, release = gguf_recipes("model.gguf")   # loaded on demand
    config, tensors = load_gguf("model.gguf")      # dict, {HF name: fp32 tensor}
    tokenizer = gguf_tokenizer("model.gguf")

Architectures: `llama` (model_type "llama"), llama.cpp's Qwen hybrids (qwen35.py):
`qwen35` (dense Qwen3.5), `qwen35moe` (Qwen3.5/3.6-MoE) and `qwen3next`, and its state
space hybrids (mamba.py): `mamba2`, `nemotron_h`, `granitehybrid`, `falcon-h1`, `jamba`,
Gemma 3's text model (gemma.py): `gemma3`, and gpt-oss (gpt_oss.py): `gpt-oss`.
The file is memory-mapped (reader.py); a tensor is read when the loader assigns it: F32
/ F16 / BF16 data as a view of the mapping, block-quantized types dequantized to fp32
with the `gguf` package then. Only the transforms llama.cpp's converter
(convert_hf_to_gguf.py) applied are undone: for llama, the row permutation of q/k that
turns rotate-half rotary into llama.cpp's interleaved pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ckptd.model.checkpoint import Recipe, plain
from ckptd.model.gguf.gemma import load_gemma3
from ckptd.model.gguf.gpt_oss import load_gpt_oss
from ckptd.model.gguf.header import read_architecture
from ckptd.model.gguf.kept import check_types, kept_recipes
from ckptd.model.gguf.mamba import load_ssm_hybrid
from ckptd.model.gguf.qwen35 import load_qwen_hybrid
from ckptd.model.gguf.reader import (
    GGUFTensors,
    convert_tensors,
    field,
    open_gguf,
    require,
    scalar,
    unpermute,
)
from ckptd.model.text.tokenizer import Tokenizer

SUPPORTED = ("llama", "qwen35", "qwen35moe", "qwen3next",
             # the state space hybrids: gguf/mamba.py
             "mamba2", "nemotron_h", "nemotron_h_moe", "granitehybrid", "falcon-h1", "jamba",
             "gemma3", "gpt-oss")

# GGUF tensor names (blk.N.<part>.weight) -> HF names (model.layers.N.<module>.weight)
_LLAMA_TOP = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LLAMA_BLOCK = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def gguf_tokenizer(reader_or_path) -> Tokenizer:
    """The Tokenizer described by a GGUF's metadata (a path or an open GGUFReader)."""
    return Tokenizer.from_gguf(reader_or_path)


def check_architecture(path: str | Path) -> str:
    """The GGUF's architecture, from its header alone; ValueError naming it and the
    supported ones when it is not one of them."""
    arch = read_architecture(path)
    if arch not in SUPPORTED:
        raise ValueError(f"unsupported GGUF architecture {arch!r} in {path} "
                         f"(supported: {', '.join(SUPPORTED)})")
    return arch


def gguf_recipes(path: str | Path, reader=None, keep: bool = False
                 ) -> tuple[dict, dict[str, Recipe], Callable[..., None]]:
    """(Hugging Face style config dict, {HF tensor name: recipe}, release) of a GGUF.

    A recipe reads its tensor when called (model/checkpoint.py); `release()` drops the
    file pages read since the last call, `release(everything=True)` all of them.
    `reader`: an already open GGUFReader of `path`, to read the file once when the
    tokenizer is wanted too. Tied embeddings: no lm_head.weight, tie_word_embeddings.
    keep: recipes return the tensors of kept types as stored (gguf/kept.py); a type
    the mode cannot serve is refused here, before any weight is read."""
    reader = reader or open_gguf(path)
    arch = field(reader, "general.architecture")
    tensors = GGUFTensors(reader, path)
    check_types(tensors, keep)
    if arch == "llama":
        cfg, recipes = _load_llama(reader, tensors)
    elif arch == "gemma3":
        cfg, recipes = load_gemma3(reader, tensors)
    elif arch == "gpt-oss":
        cfg, recipes = load_gpt_oss(reader, tensors)
    elif arch in SUPPORTED and arch.startswith("qwen"):
        cfg, recipes = load_qwen_hybrid(reader, tensors, arch)
    elif arch in SUPPORTED:
        cfg, recipes = load_ssm_hybrid(reader, tensors, arch)
    else:
        raise ValueError(f"unsupported GGUF architecture {arch!r} in {path} "
                         f"(supported: {', '.join(SUPPORTED)})")
    if keep:
        recipes = kept_recipes(tensors, recipes)
    return cfg, recipes, tensors.release


def load_gguf(path: str | Path, reader=None) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config dict, {HF tensor name: fp32 tensor}), every tensor read now (tests and
    tools; the loader reads them one at a time through gguf_recipes)."""
    cfg, recipes, _ = gguf_recipes(path, reader)
    cpu = torch.device("cpu")
    return cfg, {name: r(torch.float32, cpu) for name, r in recipes.items()}


def _load_llama(reader, tensors: GGUFTensors) -> tuple[dict, dict[str, Recipe]]:
    cfg = _llama_config(reader, tensors)
    if "rope_freqs.weight" in tensors or field(reader, "llama.rope.scaling.type",
                                               "none") != "none":
        raise ValueError("this llama GGUF uses rope scaling (rope_freqs / rope.scaling.type), "
                         "which is not supported")
    n = cfg["num_hidden_layers"]
    require(tensors, ["token_embd.weight", "output_norm.weight"]
            + [f"blk.{i}.{p}.weight" for i in range(n) for p in _LLAMA_BLOCK])
    if "blk.0.attn_q.bias" in tensors:
        cfg["attention_bias"] = True
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}

    def block(i: int, part: str):
        stem, _, suffix = part.partition(".")
        if stem not in _LLAMA_BLOCK:
            return None
        name = f"blk.{i}.{part}"
        get = (lambda: unpermute(tensors.get(name), heads[stem])) if stem in heads \
            else (lambda: tensors.get(name))
        return [(f"model.layers.{i}.{_LLAMA_BLOCK[stem]}.{suffix}", plain(get))]

    out = convert_tensors(tensors, n, _LLAMA_TOP, block)
    cfg["tie_word_embeddings"] = "lm_head.weight" not in out
    return cfg, out


def _llama_config(reader, tensors: GGUFTensors) -> dict:
    a = "llama"
    try:
        heads = int(field(reader, f"{a}.attention.head_count"))
        hidden = int(field(reader, f"{a}.embedding_length"))
        cfg = {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": _vocab_size(reader, tensors),
            "hidden_size": hidden,
            "intermediate_size": int(field(reader, f"{a}.feed_forward_length")),
            "num_hidden_layers": int(field(reader, f"{a}.block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(field(reader, f"{a}.attention.head_count_kv", heads)),
            "head_dim": int(field(reader, f"{a}.attention.key_length", hidden // heads)),
            "rope_theta": scalar(field(reader, f"{a}.rope.freq_base", 10000.0)),
            "rms_norm_eps": scalar(field(reader, f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
            "max_position_embeddings": int(field(reader, f"{a}.context_length", 8192)),
            "hidden_act": "silu",
            "attention_bias": False,
            "tie_word_embeddings": False,
            "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
            "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
        }
    except TypeError:  # int(None): a required key is absent
        raise ValueError("llama GGUF lacks a required key (llama.attention.head_count, "
                         "embedding_length, feed_forward_length or block_count)") from None
    rot = field(reader, f"{a}.rope.dimension_count")
    if rot is not None and int(rot) != cfg["head_dim"]:
        cfg["partial_rotary_factor"] = int(rot) / cfg["head_dim"]
    return cfg


def _vocab_size(reader, tensors: GGUFTensors) -> int:
    t = tensors.by_name.get("token_embd.weight")
    if t is None:
        raise ValueError(f"GGUF {tensors.path or ''} is missing tensor 'token_embd.weight'")
    return int(t.shape[1])  # GGUF dims: [hidden, vocab]

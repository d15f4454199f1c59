"""Read a GGUF file: a Hugging Face style config, weights under Hugging Face names,
and the tokenizer.

    config, recipes, release = gguf_recipes("model.gguf")   # loaded on demand
    config, tensors = load_gguf("model.gguf")      # dict, {HF name: fp32 tensor}
    tokenizer = gguf_tokenizer("model.gguf")

Architectures: `llama` (model_type "llama"), llama.cpp's Qwen hybrids (qwen35.py):
`qwen35` (dense Qwen3.5), `qwen35moe` (Qwen3.5/3.6-MoE) and `qwen3next`, and its state
space hybrids (mamba.py): `mamba2`, `nemotron_h`, `granitehybrid`, `falcon-h1`, `jamba`. The file is
memory-mapped; a tensor is read when the loader assigns it: F32 / F16 / BF16 data as
a view of the mapping, block-quantized types dequantized to fp32 with the `gguf`
package then. GGUF lists dimensions fastest first; the reader's numpy arrays are
already in torch order, so only the transforms llama.cpp's converter
(convert_hf_to_gguf.py) applied are undone: for llama, the row permutation of q/k
that turns rotate-half rotary into llama.cpp's interleaved pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ckptd.model.checkpoint import Recipe, plain
from ckptd.model.gguf.header import read_architecture
from ckptd.model.weights import drop_pages, view

SUPPORTED = ("llama", "qwen35", "qwen35moe", "qwen3next",
             # the state space hybrids: gguf/mamba.py
             "mamba2", "nemotron_h", "nemotron_h_moe", "granitehybrid", "falcon-h1", "jamba")

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


def open_gguf(path: str | Path):
    """A gguf.GGUFReader; FileNotFoundError, or ValueError for a file that is not a
    readable GGUF (bad magic, truncated)."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such GGUF file: {path}")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (bad magic)")
    try:
        # copy-on-write: tensors view the mapping writable, and nothing writes them
        return gguf.GGUFReader(str(path), "c")
    except Exception as e:  # truncation surfaces as ValueError, IndexError, struct.error, ...
        raise ValueError(f"cannot read GGUF {path} (truncated or corrupt?): "
                         f"{type(e).__name__}: {e}") from None


def field(reader, name: str, default=None):
    """A metadata value (scalar, str or list), or default when absent."""
    f = reader.fields.get(name)
    return default if f is None else f.contents()


def gguf_tokenizer(reader_or_path):
    """The Tokenizer described by a GGUF's metadata (a path or an open GGUFReader)."""
    from ckptd.model.text.tokenizer import Tokenizer
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
    from ckptd.model.gguf.kept import check_types, kept_recipes
    reader = reader or open_gguf(path)
    arch = field(reader, "general.architecture")
    tensors = GGUFTensors(reader, path)
    check_types(tensors, keep)
    if arch == "llama":
        cfg, recipes = _load_llama(reader, tensors)
    elif arch in SUPPORTED and arch.startswith("qwen"):
        from ckptd.model.gguf.qwen35 import load_qwen_hybrid
        cfg, recipes = load_qwen_hybrid(reader, tensors, arch)
    elif arch in SUPPORTED:
        from ckptd.model.gguf.mamba import load_ssm_hybrid
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


class GGUFTensors:
    """A GGUF's tensors by name: views of the mapped file, or dequantized to fp32."""

    def __init__(self, reader, path: str | Path | None = None) -> None:
        self.by_name = {t.name: t for t in reader.tensors}
        self.path = path
        self._mm = getattr(reader.data, "_mmap", None)    # np.memmap's mapping
        self._read = False
        # gguf/kept.py: while a list, kept tensors read are appended here and get()
        # hands out their row numbers instead of their values ([rows, 1]; with probe
        # "rows" or "cols", every element's row or column number, [rows, cols])
        self.row_ids: list | None = None
        self.probe = ""

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def names(self) -> list[str]:
        return list(self.by_name)

    def shape(self, name: str) -> tuple[int, ...]:
        """torch order (GGUF lists dimensions fastest first)."""
        return tuple(int(n) for n in reversed(self.by_name[name].shape.tolist()))

    def get(self, name: str) -> torch.Tensor:
        import gguf

        t = self.by_name.get(name)
        if t is None:
            raise ValueError(f"GGUF {self.path or ''} is missing tensor {name!r}")
        want = self.shape(name)
        self._read = True
        if self.row_ids is not None:
            from ckptd.model.gguf.kept import kept_view
            qt = kept_view(self, name)
            if qt is not None:
                self.row_ids.append(qt)
                if len(want) != 2:      # experts: experts.py asks kept() for those
                    raise ValueError(f"{name}: a kept {len(want)}-D tensor is not a row set")
                rows = torch.arange(want[0], dtype=torch.float64).view(want[0], 1)
                if self.probe == "rows":
                    return rows.expand(want)         # a view: no memory
                if self.probe == "cols":
                    return torch.arange(want[1], dtype=torch.float64).expand(want)
                return rows
        kind = gguf.GGMLQuantizationType
        dtypes = {kind.F32: torch.float32, kind.F16: torch.float16, kind.BF16: torch.bfloat16}
        if t.tensor_type in dtypes and self._mm is not None:
            return view(self._mm, dtypes[t.tensor_type], int(t.data_offset), want)
        try:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ValueError(f"GGUF tensor {name!r} has type {t.tensor_type.name}, which the "
                             "gguf package cannot dequantize") from None
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32).reshape(want))

    def kept(self, name: str):
        """The tensor as stored (a QuantTensor) when kept mode is reading and its type is
        kept, else None."""
        if self.row_ids is None:
            return None
        from ckptd.model.gguf.kept import kept_view
        qt = kept_view(self, name)
        if qt is not None:
            self.row_ids.append(qt)
        return qt

    def release(self, everything: bool = False) -> None:
        """Drop the file's mapped pages (after a read, or always with everything): the
        whole file, as model/weights.py does and for the same reason."""
        if self._mm is not None and (everything or self._read):
            drop_pages(self._mm, [(0, len(self._mm))])
        self._read = False


def scalar(v) -> float:
    """A float read from fp32 metadata, as its shortest decimal (1e-06, not 9.99999997e-07)."""
    return float(str(np.float32(v)))


def convert_tensors(tensors: GGUFTensors, n_layers: int, top: dict[str, str],
                    block: Callable[[int, str], list[tuple[str, Recipe]] | None],
                    skip: Callable[[str], bool] = lambda name: False) -> dict[str, Recipe]:
    """A recipe per HF name. `top` maps non-block names; `block(layer, part)` converts
    blk.<layer>.<part> (part includes the .weight/.bias suffix) into (HF name, recipe)
    pairs (none where another part's recipe reads this one too), or None for parts it
    does not know; `skip(name)` drops tensors that are not needed."""
    out: dict[str, Recipe] = {}
    for name in tensors.names():
        if skip(name):
            continue
        stem, _, suffix = name.rpartition(".")
        if stem in top:
            out[f"{top[stem]}.{suffix}"] = plain(lambda name=name: tensors.get(name))
            continue
        parts = name.split(".", 2)
        res = None
        if parts[0] == "blk" and len(parts) == 3 and parts[1].isdigit():
            layer = int(parts[1])
            if layer >= n_layers:
                raise ValueError(f"GGUF tensor {name!r} is past the model's {n_layers} layers")
            res = block(layer, parts[2])
        if res is None:
            raise ValueError(f"unexpected tensor {name!r} in GGUF {tensors.path or ''}")
        out.update(res)
    return out


def require(tensors: GGUFTensors, names: list[str]) -> None:
    """ValueError naming the first absent tensor."""
    for name in names:
        if name not in tensors:
            raise ValueError(f"GGUF {tensors.path or ''} is missing tensor {name!r}")


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
        get = (lambda: _unpermute(tensors.get(name), heads[stem])) if stem in heads \
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


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation. Per head of d rows the converter stores
    row (half h, index i) of the rotate-half layout at position 2i + h; rows [n_heads*d, ...]
    (a bias too)."""
    rows = w.shape[0]
    d = rows // n_heads
    rest = w.shape[1:]
    return w.reshape(n_heads, d // 2, 2, *rest).transpose(1, 2).reshape(rows, *rest)

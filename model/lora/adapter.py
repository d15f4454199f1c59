"""A LoRA adapter as read from a file: for each adapted linear (its module name in the
model, Hugging Face style) the pair A [rank, in], B [out, rank] and the factor
alpha / rank that PEFT and llama.cpp put in front of B (A x).

    adapter = read_adapter("lora.gguf", model)     # or a PEFT folder
    adapter.pairs["model.layers.0.self_attn.q_proj"].a      # [rank, hidden]

Two sources:
- GGUF as llama.cpp's convert_lora_to_gguf.py writes it: `general.type = adapter`,
  `adapter.type = lora`, `adapter.lora.alpha`, tensors `<base tensor>.lora_a` /
  `.lora_b` under llama.cpp's names, after the converter's transforms of the base
  tensor (llama's q/k row permutation, Qwen3.5's tiled value heads), which are undone
  here on B's rows or A's columns as model/gguf/ undoes them on the base weights.
  llama.cpp scales by alpha / rank, or by 1 when alpha is 0.
- a PEFT folder (adapter_config.json + adapter_model.safetensors): `lora_alpha / r`
  (`use_rslora`: / sqrt(r)); DoRA and per-module alphas are refused.

Every pair is checked against the model before serving: an unknown target, a shape
that is not the model's, another architecture, is one ValueError naming the tensor.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from ckptd.model.gguf.reader import GGUFTensors, field, open_gguf, unpermute
from ckptd.model.lora.targets import adaptable

# model_type -> the architecture a GGUF adapter for it names
GGUF_ARCH = {"llama": "llama", "qwen3_5_text": "qwen35", "qwen3_5_moe_text": "qwen35moe",
             "qwen3_next": "qwen3next"}
# llama.cpp block tensor -> module under model.layers.N (the converter's names)
_GGUF_BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z", "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a", "ssm_out": "linear_attn.out_proj",
}
_GGUF_TOP = {"output": "lm_head"}


@dataclass(frozen=True)
class LoraPair:
    a: torch.Tensor          # [rank, in]
    b: torch.Tensor          # [out, rank]
    factor: float            # alpha / rank: what a scale of 1 multiplies B (A x) by


@dataclass(frozen=True)
class Adapter:
    path: str
    pairs: dict[str, LoraPair]   # module name (model.layers.0.self_attn.q_proj) -> pair
    digest: str                  # blake2b-128 of the adapter's bytes: its cache identity


def read_adapter(path: str | Path, model) -> Adapter:
    """The adapter at `path` (a .gguf file or a PEFT folder), checked against `model`."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"LoRA adapter {path}: no such file or folder")
    if model.config.arch not in GGUF_ARCH:    # the state space hybrids: not wired for LoRA
        raise ValueError(f"LoRA adapter {path}: adapters are not supported on "
                         f"{model.config.arch} models")
    if p.is_dir():
        pairs, digest = _read_peft(p)
    else:
        pairs, digest = _read_gguf(p, model.config)
    if not pairs:
        raise ValueError(f"LoRA adapter {path}: it adapts no layer")
    dtype, device = model.dtype, model.device
    for name, pair in pairs.items():
        _check_target(model, path, name, pair)
    pairs = {n: LoraPair(q.a.to(device, dtype).contiguous(), q.b.to(device, dtype).contiguous(),
                         q.factor) for n, q in pairs.items()}
    return Adapter(str(path), pairs, digest)


def _check_target(model, path, name: str, pair: LoraPair) -> None:
    if name not in adaptable(model):
        raise ValueError(f"LoRA adapter {path}: {name} is not a linear layer ckptd adapts "
                         "(attention, Gated DeltaNet and dense MLP projections, lm_head)")
    mod = model.get_submodule(name)
    rank = pair.a.shape[0]
    want_a, want_b = (rank, mod.in_features), (mod.out_features, rank)
    if pair.a.dim() != 2 or pair.b.dim() != 2 or tuple(pair.a.shape) != want_a \
            or tuple(pair.b.shape) != want_b:
        raise ValueError(f"LoRA adapter {path}: {name} has A {tuple(pair.a.shape)}, B "
                         f"{tuple(pair.b.shape)}; the model needs A {want_a}, B {want_b} "
                         "(an adapter for another base model?)")


def _digest(*blobs: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for b in blobs:
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def _read_gguf(path: Path, cfg) -> tuple[dict[str, LoraPair], str]:
    reader = open_gguf(path)
    kind, atype = field(reader, "general.type"), field(reader, "adapter.type")
    if kind != "adapter" or atype != "lora":
        raise ValueError(f"LoRA adapter {path}: not a LoRA adapter GGUF (general.type "
                         f"{kind!r}, adapter.type {atype!r}; want 'adapter', 'lora')")
    arch, want = field(reader, "general.architecture"), GGUF_ARCH.get(cfg.arch)
    if arch != want:
        raise ValueError(f"LoRA adapter {path}: made for architecture {arch!r}, the model "
                         f"is {want or cfg.arch!r}")
    alpha = float(field(reader, "adapter.lora.alpha", 0.0))
    if field(reader, "adapter.alora.invocation_tokens") is not None:
        raise ValueError(f"LoRA adapter {path}: activated LoRA (aLoRA) is not supported")
    tensors = GGUFTensors(reader, path)
    stems: dict[str, dict[str, str]] = {}
    for name in tensors.names():
        stem, _, part = name.rpartition(".")
        if part not in ("lora_a", "lora_b"):
            raise ValueError(f"LoRA adapter {path}: tensor {name!r} is not a lora_a/lora_b "
                             "pair (norm or embedding tensors are not supported)")
        stems.setdefault(stem, {})[part] = name
    pairs = {}
    for stem, parts in stems.items():
        if len(parts) != 2:
            raise ValueError(f"LoRA adapter {path}: {stem} lacks its "
                             f"{'lora_b' if 'lora_a' in parts else 'lora_a'}")
        module, undo = _gguf_target(stem, cfg, path)
        a = tensors.get(parts["lora_a"]).float().clone()
        b = tensors.get(parts["lora_b"]).float().clone()
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise ValueError(f"LoRA adapter {path}: {stem} has lora_a {tuple(a.shape)}, lora_b "
                             f"{tuple(b.shape)}: not a rank-r pair")
        a, b = undo(a, b)
        rank = a.shape[0]
        pairs[module] = LoraPair(a, b, alpha / rank if alpha else 1.0)
    tensors.release(everything=True)
    return pairs, _digest(path.read_bytes())


def _gguf_target(stem: str, cfg, path):
    """(module name, undo(a, b) -> (a, b)) of a base tensor name blk.N.part.weight."""
    name, _, suffix = stem.rpartition(".")
    parts = name.split(".")
    if suffix == "weight" and name in _GGUF_TOP:
        return _GGUF_TOP[name], _same
    if suffix == "weight" and len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() \
            and parts[2] in _GGUF_BLOCK and int(parts[1]) < cfg.num_layers:
        return f"model.layers.{parts[1]}.{_GGUF_BLOCK[parts[2]]}", _undo(parts[2], cfg)
    raise ValueError(f"LoRA adapter {path}: {stem} is not a layer ckptd adapts in this model")


def _same(a, b):
    return a, b


def _undo(part: str, cfg):
    """The converter's transform of the base tensor, undone on the pair: a row
    permutation applies to B's rows, a column permutation to A's columns."""
    if cfg.arch == "llama" and part in ("attn_q", "attn_k"):
        heads = cfg.num_heads if part == "attn_q" else cfg.num_kv_heads
        return lambda a, b: (a, unpermute(b, heads))
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    if cfg.arch == "qwen3_next" or not hk or hk == hv or part not in (
            "attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_out"):
        return _same
    kd, dv = hk * cfg.linear_key_head_dim, cfg.linear_value_head_dim

    def untile(t: torch.Tensor, dim: int, d: int) -> torch.Tensor:
        # value heads along dim from llama.cpp's tiled [r, hk, d] to grouped [hk, r, d]
        shape = list(t.shape)
        t = t.reshape(shape[:dim] + [hv // hk, hk, d] + shape[dim + 1:])
        return t.transpose(dim, dim + 1).reshape(shape)

    if part == "attn_qkv":
        return lambda a, b: (a, torch.cat([b[:2 * kd], untile(b[2 * kd:], 0, dv)]))
    if part == "attn_gate":
        return lambda a, b: (a, untile(b, 0, dv))
    if part == "ssm_out":
        return lambda a, b: (untile(a, 1, dv), b)
    return lambda a, b: (a, untile(b, 0, 1))


def _read_peft(folder: Path) -> tuple[dict[str, LoraPair], str]:
    cfg_file, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not cfg_file.is_file() or not weights.is_file():
        raise ValueError(f"LoRA adapter {folder}: a PEFT folder needs adapter_config.json and "
                         "adapter_model.safetensors")
    try:
        conf = json.loads(cfg_file.read_text())
    except ValueError as e:
        raise ValueError(f"LoRA adapter {folder}: adapter_config.json: {e}") from None
    if conf.get("peft_type", "LORA") != "LORA" or conf.get("use_dora"):
        raise ValueError(f"LoRA adapter {folder}: only plain LoRA is supported (peft_type "
                         f"{conf.get('peft_type')!r}, use_dora {conf.get('use_dora')})")
    if conf.get("alpha_pattern"):
        raise ValueError(f"LoRA adapter {folder}: per-module alphas (alpha_pattern) are "
                         "not supported")
    alpha = float(conf.get("lora_alpha", conf.get("r", 8)))
    tensors = load_file(weights)
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        stem = name.removeprefix("base_model.model.")
        for tag, key in ((".lora_A.weight", "a"), (".lora_B.weight", "b")):
            if stem.endswith(tag):
                halves.setdefault(stem[:-len(tag)], {})[key] = t
                break
        else:
            raise ValueError(f"LoRA adapter {folder}: tensor {name!r} is not a lora_A/lora_B "
                             "weight (embeddings, norms, biases are not supported)")
    pairs = {}
    for module, h in halves.items():
        if len(h) != 2:
            raise ValueError(f"LoRA adapter {folder}: {module} lacks half of its pair")
        rank = h["a"].shape[0]
        root = math.sqrt(rank) if conf.get("use_rslora") else rank
        pairs[module] = LoraPair(h["a"].float(), h["b"].float(), alpha / root)
    return pairs, _digest(cfg_file.read_bytes(), weights.read_bytes())

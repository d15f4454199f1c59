"""Swapping a built model's modules for the kept-weight ones of model/quant.py
(`--weights keep`): the loader hands over the parameters whose checkpoint tensors stay
in their GGUF formats, and each one's module is replaced.

    nn.Linear       -> KeptLinear      (a KeptColumns weight: its input permuted instead)
    nn.Embedding    -> KeptEmbedding
    Experts         -> KeptExperts     when its gate_up and down are both kept

The MoE router and the shared expert's gate stay plain: route() reads the router's
weight as fp32 (a near-tie must pick the expert transformers picks), and both are tiny.
"""

from __future__ import annotations

import torch
from torch import nn

from ckptd.kernels.quant import cpu
from ckptd.kernels.quant.formats import QuantTensor
from ckptd.model.arch.moe import Experts
from ckptd.model.fingerprint import folded
from ckptd.model.quant import (
    Kept,
    KeptColumns,
    KeptEmbedding,
    KeptExperts,
    KeptGateUp,
    KeptLinear,
    KeptMatmul,
)

_PLAIN = ("mlp.gate.weight", "mlp.shared_expert_gate.weight")
_HEAD = "lm_head"       # the logits' matmul keeps fp32 activations (use_gemv_activations)


def attach_kept(model: nn.Module, kept: dict[str, Kept], dtype: torch.dtype
                ) -> dict[str, torch.Tensor]:
    """Swap the modules of kept parameters (names as in model.state_dict()) for Kept*
    ones. Returns the parameters that stay plain, dequantized to `dtype` (the router, a
    MoE layer with only one of its expert tensors kept, anything not a linear)."""
    plain: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[str, Kept]] = {}
    for name, t in kept.items():
        path, _, attr = name.rpartition(".")
        mod = model.get_submodule(path)
        if isinstance(mod, Experts):
            experts.setdefault(path, {})[attr] = t
        elif isinstance(mod, nn.Linear) and attr == "weight" and not name.endswith(_PLAIN) \
                and isinstance(t, (QuantTensor, KeptColumns)):
            weight, columns = (t.weight, t.columns) if isinstance(t, KeptColumns) else (t, None)
            _replace(model, path, KeptLinear(weight, mod.bias, columns))
        elif isinstance(mod, nn.Embedding) and isinstance(t, QuantTensor):
            _replace(model, path, KeptEmbedding(t, dtype))
        else:
            plain[name] = t.dequantize(dtype)
    for path, parts in experts.items():
        gu, down = parts.get("gate_up_proj"), parts.get("down_proj")
        if isinstance(gu, KeptGateUp) and isinstance(down, QuantTensor):
            _replace(model, path, KeptExperts(gu.gate, gu.up, down))
        else:
            plain.update({f"{path}.{a}": t.dequantize(dtype) for a, t in parts.items()})
    return plain


def use_gemv_activations(model: nn.Module, mode: str) -> None:
    """How the model's kept Q4_0 / Q4_1 / Q8_0 matmuls of a decode step (a few rows, on
    the CPU) take their activations: "fp32", or "q8", rounded to int8 per block of 32
    and multiplied in integers as llama.cpp does (kernels/quant/cpu.py; the logits
    change slightly). With q8 the model's KV and logits are another path's, so its
    fingerprint changes: caches of the two never mix. ValueError for another mode."""
    if mode not in cpu.ACTIVATIONS:
        raise ValueError(f"--gemv-activations must be one of {', '.join(cpu.ACTIVATIONS)}, "
                         f"got {mode!r}")
    if mode == getattr(model, "gemv_activations", "fp32"):
        return
    if getattr(model, "gemv_activations", None) is not None:
        raise ValueError("the model's gemv activations are already chosen")
    users = [m for name, m in model.named_modules()
             if isinstance(m, KeptLinear) and not name.endswith(_HEAD)]
    users += [v for m in model.modules() for a, v in vars(m).items()   # fused q/k/v, gate/up
              if isinstance(v, KeptMatmul) and a != "head"]             # (model/arch/layers.py)
    for u in users:
        u.activations = mode
    model.gemv_activations = mode
    if any(isinstance(m, KeptLinear) and m.qweight.fmt in cpu.Q8_FORMATS
           and m.qweight.data.device.type == "cpu" for m in users):
        model.fingerprint = folded(model.fingerprint, f"gemv={mode}")


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, child = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)

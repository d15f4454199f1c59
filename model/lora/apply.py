"""LoRA adapters applied unmerged, so every sequence of a step has its own scales:

    y = W x + sum over adapters i of  s_i(token) * (alpha_i / rank_i) * B_i (A_i x)

The base weights stay as they are (plain, oneDNN-packed or kept in a GGUF format): the
fused matmul of a module (layers.Matmul, quant.KeptMatmul) is wrapped by a LoraMatmul
that adds each adapter's term to the columns of the projection it adapts. A step's
per-token scales come from its batch (`Rows`, built by StepBatch.build from each
sequence's scales); an adapter no token of the step uses costs nothing, and a step in
which none is used runs the base model alone (bit for bit: scale 0 is the base model).

    lora = Lora([adapter, ...]); lora.attach(model)      # model.fuse() keeps it attached
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ckptd.model.lora.adapter import Adapter

# module class name -> [(fused matmul attribute, the linears it computes side by side)]
_FUSED = {
    "Attention": [("qkv", ("q_proj", "k_proj", "v_proj")), ("out", ("o_proj",))],
    "MLP": [("gate_up", ("gate_proj", "up_proj")), ("down", ("down_proj",))],
    "GatedDeltaNet": [("in_proj", ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")),
                      ("out", ("out_proj",))],
}


@dataclass(frozen=True)
class Rows:
    """A step's LoRA scales: `active` adapters (indices) and scales [N, len(active)] per
    token, on the model's device, in the model's dtype."""
    active: tuple[int, ...]
    scales: torch.Tensor

    @classmethod
    def build(cls, per_seq: list[tuple[float, ...]], q_lens: list[int],
              device: torch.device, dtype: torch.dtype) -> Rows | None:
        """None when no sequence uses an adapter (the step runs the base model)."""
        width = max((len(s) for s in per_seq), default=0)
        active = tuple(i for i in range(width)
                       if any(i < len(s) and s[i] != 0.0 for s in per_seq))
        if not active:
            return None
        table = torch.tensor([[s[i] if i < len(s) else 0.0 for i in active] for s in per_seq],
                             dtype=torch.float32)
        rows = table.repeat_interleave(torch.tensor(q_lens), dim=0)
        return cls(active, rows.to(device, dtype))


def adaptable(model) -> set[str]:
    """Names of the linears a LoRA may adapt in this model."""
    out = {"lm_head"}
    for name, mod in model.named_modules():
        for _, linears in _FUSED.get(type(mod).__name__, ()):
            out.update(f"{name}.{lin}" for lin in linears)
    return out


class Lora:
    """The loaded adapters, in id order, and the current step's scales."""

    def __init__(self, adapters: list[Adapter]) -> None:
        self.adapters = adapters
        self.rows: Rows | None = None      # set by CausalLM.forward for one step

    def attach(self, model) -> None:
        model.lora = self
        self.wrap(model)

    def wrap(self, model) -> None:
        """Wrap the fused matmuls of adapted modules (after every model.fuse())."""
        for name, mod in model.named_modules():
            for attr, linears in _FUSED.get(type(mod).__name__, ()):
                self._wrap(mod, attr, [f"{name}.{lin}" for lin in linears],
                           [getattr(mod, lin).out_features for lin in linears])
        self._wrap(model, "head", ["lm_head"], [model.lm_head.out_features])

    def _wrap(self, mod, attr: str, names: list[str], widths: list[int]) -> None:
        terms = []
        start = 0
        for name, width in zip(names, widths, strict=True):
            for i, adapter in enumerate(self.adapters):
                pair = adapter.pairs.get(name)
                if pair is not None:
                    terms.append((i, start, start + width, pair))
            start += width
        base = getattr(mod, attr)
        if terms and base is not None and not isinstance(base, LoraMatmul):
            setattr(mod, attr, LoraMatmul(base, terms, self))


class LoraMatmul:
    """A fused matmul plus its adapters' terms, each on its columns [start, stop)."""

    def __init__(self, base, terms: list, lora: Lora) -> None:
        self.base, self.terms, self.lora = base, terms, lora

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        rows = self.lora.rows
        if rows is None:
            return y
        for i, start, stop, pair in self.terms:
            if i not in rows.active:
                continue
            s = rows.scales[:, rows.active.index(i), None] * pair.factor       # [N, 1]
            y[..., start:stop] += ((x @ pair.a.T) * s) @ pair.b.T
        return y

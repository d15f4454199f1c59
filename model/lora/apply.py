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
from ckptd.model.lora.targets import FUSED


@dataclass(frozen=True)
class Rows:
    """A step's LoRA scales per token: [N, adapters], on the model's device, in the
    model's dtype (0 where a sequence does not use an adapter)."""
    scales: torch.Tensor

    @classmethod
    def build(cls, per_seq: list[tuple[float, ...]], q_lens: list[int],
              device: torch.device, dtype: torch.dtype) -> Rows | None:
        """None when no sequence uses an adapter (the step runs the base model)."""
        width = max((len(s) for s in per_seq), default=0)
        if not any(any(s) for s in per_seq):
            return None
        table = torch.tensor([list(s) + [0.0] * (width - len(s)) for s in per_seq],
                             dtype=torch.float32)
        rows = table.repeat_interleave(torch.tensor(q_lens), dim=0)
        return cls(rows.to(device, dtype))

    def at(self, index: torch.Tensor) -> Rows:
        """The scales of some rows only: lm_head runs on the logits' rows."""
        return Rows(self.scales.index_select(0, index))


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
            for attr, linears in FUSED.get(type(mod).__name__, ()):
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
        if terms and base is None:      # an unfused module would run without its adapter
            raise RuntimeError("LoRA adapters attach to a fused model (CausalLM.fuse)")
        if terms and not isinstance(base, LoraMatmul):
            setattr(mod, attr, LoraMatmul(base, terms, self, start))


class LoraMatmul:
    """A fused matmul plus every adapter term on its output columns, in two matmuls:

        y += ((x @ A.T) * S) @ B.T

    A [R, in] stacks every term's A (R = the sum of their ranks); B [out, R] holds each
    term's B * alpha/rank in its columns and its output rows, zero elsewhere; S [N, R] is
    each token's scale of the adapter a column belongs to (0: the term adds exactly 0).
    One pair of matmuls instead of one per projection and adapter: a SmolLM2 decode step
    makes ~600 small ops for its adapter instead of ~1300."""

    def __init__(self, base, terms: list, lora: Lora, out: int) -> None:
        self.base, self.lora = base, lora
        first = terms[0][3].a
        ranks = [t[3].a.shape[0] for t in terms]
        self.a = torch.cat([t[3].a for t in terms])                          # [R, in]
        self.b = first.new_zeros(out, sum(ranks))                            # [out, R]
        col = 0
        for (_, start, stop, pair), r in zip(terms, ranks, strict=True):
            self.b[start:stop, col:col + r] = pair.b * pair.factor
            col += r
        self.adapter_of = torch.tensor([t[0] for t, r in zip(terms, ranks, strict=True)
                                        for _ in range(r)], device=first.device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        rows = self.lora.rows
        if rows is None:
            return y
        s = rows.scales.index_select(1, self.adapter_of)                    # [N, R]
        return y.add_(((x @ self.a.T) * s) @ self.b.T)

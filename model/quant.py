"""Modules over weights kept in their GGUF formats (`--weights keep`).

The loader builds the model as usual; a parameter whose checkpoint tensor is kept
(kernels/quant/formats.py: QuantTensor, usually a view of the mapped file) is not
assigned: `attach_kept` swaps its module for one of these instead.

    nn.Linear       -> KeptLinear      x @ W.T through ops.quant_matmul
    nn.Embedding    -> KeptEmbedding   dequantizes only the rows looked up
    Experts         -> KeptExperts     gate, up [E, I, H] and down [E, H, I] as stored
    (a KeptColumns weight: KeptLinear permutes its input instead of the columns)
                                       (ffn_{gate,up}_exps may differ in format)

The MoE router and the shared expert's gate stay plain: route() reads the router's
weight as fp32 (a near-tie must pick the expert transformers picks), and both are tiny.
`fuse_kept` fuses projections that share an input like layers.fuse_linears does:
rows of one format are concatenated and each module's weight becomes a view of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ckptd.kernels import ops
from ckptd.kernels.quant.formats import QuantTensor, cat_rows

_PLAIN = ("mlp.gate.weight", "mlp.shared_expert_gate.weight")


@dataclass(frozen=True)
class KeptGateUp:
    """A MoE layer's gate and up expert tensors, each [E, I, H] as the file keeps them;
    `shape` is the [E, 2I, H] parameter they stand for."""
    gate: QuantTensor
    up: QuantTensor

    @property
    def shape(self) -> tuple[int, ...]:
        E, inter, hidden = self.gate.shape
        return (E, 2 * inter, hidden)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.cat([self.gate.dequantize(dtype), self.up.dequantize(dtype)], dim=1)

    def to(self, device: torch.device | str) -> KeptGateUp:
        return KeptGateUp(self.gate.to(device), self.up.to(device))


@dataclass(frozen=True)
class KeptColumns:
    """A 2-D kept tensor whose parameter is the stored one with its columns permuted
    (Qwen3.5's out_proj, value heads tiled for ggml): parameter column j is stored column
    columns[j]. A permutation of heads is not one of blocks, so the bytes stay as stored
    and the input is permuted instead (KeptLinear)."""
    weight: QuantTensor
    columns: torch.Tensor           # int64 [cols]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.weight.shape

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return self.weight.dequantize(dtype)[:, self.columns]

    def to(self, device: torch.device | str) -> KeptColumns:
        return KeptColumns(self.weight.to(device), self.columns.to(device))


Kept = QuantTensor | KeptGateUp | KeptColumns


def is_kept(t) -> bool:
    return isinstance(t, (QuantTensor, KeptGateUp, KeptColumns))


def _moved(qt: QuantTensor, fn) -> QuantTensor:
    """A kept tensor through nn.Module._apply's fn: .to(device), .cuda(), .to("meta")
    move its bytes; a dtype change leaves them (fn converts floating tensors only)."""
    return QuantTensor(fn(qt.data), qt.fmt, qt.shape)


class KeptLinear(nn.Module):
    """x @ W.T (+ bias); with `columns` (KeptColumns), W is the stored tensor's columns in
    that order: x @ W.T = x[..., argsort(columns)] @ stored.T."""

    def __init__(self, weight: QuantTensor, bias: nn.Parameter | None,
                 columns: torch.Tensor | None = None) -> None:
        super().__init__()
        self.qweight = weight
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.in_index = None if columns is None else \
            torch.argsort(columns).to(weight.data.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_index is not None:
            x = x.index_select(-1, self.in_index)
        return ops.quant_matmul(x, self.qweight, self.bias)

    def _apply(self, fn, recurse=True):
        # the kept bytes are no parameter: the model's .to() moves them here
        self.qweight = _moved(self.qweight, fn)
        if self.in_index is not None:
            self.in_index = fn(self.in_index)
        return super()._apply(fn, recurse)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """forward without the bias (a part of a KeptMatmul, which adds the biases)."""
        return ops.quant_matmul(x.index_select(-1, self.in_index)
                                if self.in_index is not None else x, self.qweight)


class KeptEmbedding(nn.Module):
    def __init__(self, weight: QuantTensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.qweight = weight
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return ops.quant_embedding(ids, self.qweight, self.dtype)

    def _apply(self, fn, recurse=True):
        self.qweight = _moved(self.qweight, fn)
        self.dtype = fn(torch.empty(0, dtype=self.dtype)).dtype     # .to(dtype) changes it
        return super()._apply(fn, recurse)


class KeptExperts(nn.Module):
    def __init__(self, gate: QuantTensor, up: QuantTensor, down: QuantTensor) -> None:
        super().__init__()
        self.gate, self.up, self.down = gate, up, down

    def forward(self, x, topk_ids, topk_w) -> torch.Tensor:
        return ops.quant_moe_experts(x, topk_ids, topk_w, self.gate, self.up, self.down)

    def _apply(self, fn, recurse=True):
        self.gate, self.up, self.down = (_moved(t, fn) for t in (self.gate, self.up, self.down))
        return super()._apply(fn, recurse)


class KeptMatmul:
    """layers.Matmul's interface over fused parts: each part is a kept tensor (rows of
    one format) or a plain Matmul; their outputs side by side."""

    def __init__(self, parts: list, bias: torch.Tensor | None) -> None:
        self.parts, self.bias = parts, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        outs = [ops.quant_matmul(x, p) if isinstance(p, QuantTensor) else p(x)
                for p in self.parts]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return y if self.bias is None else y + self.bias


def fuse_kept(linears: list[nn.Module]) -> KeptMatmul:
    """One KeptMatmul for linears (some kept) that read the same input."""
    from ckptd.model.arch.layers import Matmul

    parts: list = []
    run: list[KeptLinear] = []

    def flush() -> None:
        if not run:
            return
        if len(run) == 1:
            parts.append(run[0].qweight)
            run.clear()
            return
        fused = cat_rows([m.qweight for m in run])
        row = 0
        for m in run:     # views of the fused rows: no second copy stays
            n = m.out_features
            m.qweight = QuantTensor(fused.data[row:row + n], fused.fmt, (n, fused.shape[1]))
            row += n
        parts.append(fused)
        run.clear()

    for m in linears:
        if isinstance(m, KeptLinear) and m.in_index is None and \
                (not run or run[0].qweight.fmt == m.qweight.fmt):
            run.append(m)
            continue
        flush()
        if isinstance(m, KeptLinear) and m.in_index is None:
            run.append(m)
        elif isinstance(m, KeptLinear):
            parts.append(m.matmul)          # permutes its own input
        else:
            parts.append(Matmul(m.weight.detach()))
    flush()
    biases = [m.bias for m in linears]
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    return KeptMatmul(parts, bias)


def attach_kept(model: nn.Module, kept: dict[str, Kept], dtype: torch.dtype
                ) -> dict[str, torch.Tensor]:
    """Swap the modules of kept parameters (names as in model.state_dict()) for Kept*
    ones. Returns the parameters that stay plain, dequantized to `dtype` (the router, a
    MoE layer with only one of its expert tensors kept, anything not a linear)."""
    from ckptd.model.arch.moe import Experts

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


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, child = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)

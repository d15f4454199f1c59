"""Weights kept in their GGUF formats (`--weights keep`), and the modules over them.

The loader builds the model as usual; a parameter whose checkpoint tensor is kept
(kernels/quant/formats.py: QuantTensor, usually a view of the mapped file) is not
assigned: `attach_kept` (model/kept_swap.py) swaps its module for one of these instead.

    nn.Linear       -> KeptLinear      x @ W.T through ops.quant_matmul
    nn.Embedding    -> KeptEmbedding   dequantizes only the rows looked up
    Experts         -> KeptExperts     gate, up [E, I, H] and down [E, H, I] as stored
    (a KeptColumns weight: KeptLinear permutes its input instead of the columns)
                                       (ffn_{gate,up}_exps may differ in format)

`layers.fuse_kept` fuses projections that share an input into a KeptMatmul, as
layers.fuse_linears does plain ones: rows of one format are concatenated and each
module's weight becomes a view of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ckptd.kernels import ops
from ckptd.kernels.quant.formats import QuantTensor


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
        self.activations = "fp32"       # or "q8": model/kept_swap.py, use_gemv_activations

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_index is not None:
            x = x.index_select(-1, self.in_index)
        return ops.quant_matmul(x, self.qweight, self.bias, activations=self.activations)

    def _apply(self, fn, recurse=True):
        # the kept bytes are no parameter: the model's .to() moves them here
        self.qweight = _moved(self.qweight, fn)
        if self.in_index is not None:
            self.in_index = fn(self.in_index)
        return super()._apply(fn, recurse)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """forward without the bias (a part of a KeptMatmul, which adds the biases)."""
        return ops.quant_matmul(x.index_select(-1, self.in_index)
                                if self.in_index is not None else x, self.qweight,
                                activations=self.activations)


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
        self.activations = "fp32"       # or "q8": model/kept_swap.py, use_gemv_activations

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shared: dict = {}       # parts of other formats: x rounded to int8 once for all
        outs = [ops.quant_matmul(x, p, shared=shared, activations=self.activations)
                if isinstance(p, QuantTensor) else p(x) for p in self.parts]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return y if self.bias is None else y + self.bias

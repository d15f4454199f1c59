"""Plain-torch reference for kept (block-quantized) weights: dequantize, then matmul.

    dequantize(data, fmt, cols)       uint8 [..., row_bytes] -> fp32 [..., cols]
                                      (defined with the formats: formats.py)
    matmul(x, qt)                     x [M, K] @ W.T, W [N, K] kept   -> [M, N] fp32
    embedding(ids, qt)                rows `ids` of W [V, H] only     -> [len(ids), H]
    moe_experts(x, ids, w, gate, up, down)   kernels/moe/naive.py's sum, with the
                                      experts' [E, I, H] / [E, H, I] kept

Every format dequantizes with the `gguf` package's formulas, in the same fp32
operations in the same order (gguf/quants.py, itself ggml-quants.c's
dequantize_row_*), so the values are bit-identical to what llama.cpp's converter
and ckptd's expanding loader produce; tests/kernels/test_quant_naive.py holds them to
that on real files.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ckptd.kernels.moe.naive import each_active_expert, pairs_by_expert
from ckptd.kernels.quant.formats import QuantTensor, dequantize


def matmul(x: torch.Tensor, qt: QuantTensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ dequantize(qt).T (+ bias) -> [M, N] in x's dtype."""
    return F.linear(x, qt.dequantize(x.dtype), bias)


def embedding(ids: torch.Tensor, qt: QuantTensor, dtype: torch.dtype = torch.float32):
    """Rows `ids` of a kept [V, H] table, dequantizing only those rows."""
    rows = qt.data[ids.reshape(-1).long()]
    return dequantize(rows, qt.fmt, qt.shape[-1]).to(dtype).reshape(*ids.shape, qt.shape[-1])


def moe_experts(x, topk_ids, topk_w, gate: QuantTensor, up: QuantTensor, down: QuantTensor,
                mm=matmul):
    """x [N, H]; topk_ids, topk_w [N, k]; gate, up kept [E, I, H]; down kept [E, H, I].
    Grouped by expert as kernels/moe/naive.py: only the experts some token chose are
    read, one at a time, each multiplied by `mm` (this module's matmul, or the
    dispatcher's faster one)."""
    if topk_ids.shape[0] == 0:
        return torch.zeros_like(x)
    counts, token, weight = pairs_by_expert(topk_ids, topk_w, gate.shape[0], x.dtype)

    def mlp(e: int, xe: torch.Tensor) -> torch.Tensor:
        return mm(F.silu(mm(xe, gate.expert(e))) * mm(xe, up.expert(e)), down.expert(e))
    return each_active_expert(x, counts, token, weight, mlp)

"""Plain-torch reference for kept (block-quantized) weights: dequantize, then matmul.

    dequantize(data, fmt, cols)       uint8 [..., row_bytes] -> fp32 [..., cols]
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
from ckptd.kernels.quant.formats import FORMATS, QuantTensor

_U8 = torch.uint8


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] little-endian fp16 bytes -> fp32 [n, 1]."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """qs [n, groups * width] -> [n, 2 * groups, width]: per group, low nibbles then high."""
    n = qs.shape[0]
    shifts = torch.tensor([0, 4], dtype=_U8, device=qs.device)
    q = qs.reshape(n, groups, 1, width) >> shifts.view(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, 2 * groups, width)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 bytes of 6-bit scales and mins -> (sc, min) [n, 8]."""
    s = s.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _q4_0(b):
    d = _f16(b[:, :2])
    q = _nibbles(b[:, 2:], 1, 16).reshape(-1, 32).to(torch.int8) - 8
    return d * q.float()


def _q4_1(b):
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    return d * _nibbles(b[:, 4:], 1, 16).reshape(-1, 32).float() + m


def _q8_0(b):
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, :2])


def _q4_k(b):
    n = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc.float()).reshape(n, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn.float()).reshape(n, 8, 1)
    return (d * _nibbles(b[:, 16:], 4, 32).float() - dm).reshape(n, 256)


def _q5_k(b):
    n = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc.float()).reshape(n, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn.float()).reshape(n, 8, 1)
    qh = b[:, 16:48].reshape(n, 1, 1, 32) >> torch.arange(8, dtype=_U8, device=b.device).view(
        1, 1, 8, 1)
    q = _nibbles(b[:, 48:], 4, 32) | ((qh & 0x01).reshape(n, 8, 32) << 4)
    return (d * q.float() - dm).reshape(n, 256)


def _q6_k(b):
    n = b.shape[0]
    ql = _nibbles(b[:, :128], 2, 64).reshape(n, 8, 32)
    qh = b[:, 128:192].reshape(n, 2, 1, 32) >> torch.tensor(
        [0, 2, 4, 6], dtype=_U8, device=b.device).view(1, 1, 4, 1)
    q = (ql | ((qh & 0x03).reshape(n, 8, 32) << 4)).to(torch.int8) - 32
    d = (_f16(b[:, 208:210]) * b[:, 192:208].contiguous().view(torch.int8).float())
    return (d.reshape(n, 16, 1) * q.reshape(n, 16, 16).float()).reshape(n, 256)


_BLOCKS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k,
           "Q6_K": _q6_k}


def dequantize(data: torch.Tensor, fmt: str, cols: int) -> torch.Tensor:
    """uint8 [..., row_bytes] of rows of `cols` values in `fmt` -> fp32 [..., cols]."""
    lead = data.shape[:-1]
    if fmt in ("F16", "BF16"):
        dt = torch.float16 if fmt == "F16" else torch.bfloat16
        return data.contiguous().view(dt).float().reshape(*lead, cols)
    _, bs, ts = FORMATS[fmt]
    blocks = data.reshape(-1, ts)
    return _BLOCKS[fmt](blocks).reshape(*lead, cols)


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

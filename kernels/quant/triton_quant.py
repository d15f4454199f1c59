"""Kept (GGUF-format) weights in Triton: every program dequantizes the weight tiles it
multiplies, in registers, from the stored bytes; no fp32 copy of a weight is made.

    matmul(x, qt, bias)                  x [M, K] @ W.T, W [N, K] kept     -> [M, N]
    moe_experts(x, ids, w, gate, up, down)   kernels/moe/triton_moe.py's grouped GEMM
                                         over kept experts (gate, up [E, I, H] may
                                         differ in format; down [E, H, I])

The tiles are read by tiles.py's `weight_tile`; the experts go through triton_moe's one
grouped kernel, which reads kept and plain weights alike.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels import launch
from ckptd.kernels.moe.triton_moe import align, grouped_gemm
from ckptd.kernels.quant.formats import FORMATS, QuantTensor
from ckptd.kernels.quant.tiles import weight_tile


@triton.jit
def _matmul_kernel(x, w, y, bias, M, N, K, row_bytes, stride_xm, stride_ym, fmt,
                   HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr, PREC: tl.constexpr):
    i_m = tl.program_id(0)
    i_n = tl.program_id(1)
    DT = x.dtype.element_ty                 # tiles dequantized to x's dtype, fp32 sums
    m = i_m * BM + tl.arange(0, BM)
    n = i_n * BN + tl.arange(0, BN)
    mm, mn = m < M, n < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        mk = k < K
        a = tl.load(x + m[:, None].to(tl.int64) * stride_xm + k[None, :],
                    mask=mm[:, None] & mk[None, :], other=0.)
        b = weight_tile(w, row_bytes, n[None, :].to(tl.int64), k[:, None].to(tl.int64),
                        mk[:, None] & mn[None, :], fmt, True).to(DT)
        acc += tl.dot(a, b, input_precision=PREC)
    if HAS_BIAS:
        acc += tl.load(bias + n, mask=mn, other=0.).to(tl.float32)[None, :]
    tl.store(y + m[:, None].to(tl.int64) * stride_ym + n[None, :], acc.to(y.dtype.element_ty),
             mask=mm[:, None] & mn[None, :])


def matmul(x: torch.Tensor, qt: QuantTensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W.T (+ bias) -> [M, N] in x's dtype; W [N, K] kept."""
    if x.dim() != 2 or qt.data.dim() != 2 or x.shape[1] != qt.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} does not fit a kept weight {qt.shape}")
    x = x.contiguous()
    data = qt.data.contiguous()
    M, K = x.shape
    N = qt.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    p = launch.quant_matmul(launch.target(x.device), M, x.dtype)
    grid = (triton.cdiv(M, p["BM"]), triton.cdiv(N, p["BN"]))
    _matmul_kernel[grid](x, data, y, bias if bias is not None else y, M, N, K,
                         data.stride(0), x.stride(0), y.stride(0), FORMATS[qt.fmt][0],
                         HAS_BIAS=bias is not None, **p.kwargs())
    return y


def check_experts(x, gate: QuantTensor, up: QuantTensor, down: QuantTensor):
    """(E, I, H) of kept experts gate, up [E, I, H] and down [E, H, I] over x [N, H]."""
    E, inter, H = gate.shape
    if tuple(up.shape) != (E, inter, H) or tuple(down.shape) != (E, H, inter) \
            or x.shape[-1] != H:
        raise ValueError(f"kept experts gate {gate.shape} / up {up.shape} / down "
                         f"{down.shape} do not fit x {tuple(x.shape)}")
    return E, inter, H


def moe_experts(x, topk_ids, topk_w, gate: QuantTensor, up: QuantTensor, down: QuantTensor,
                block_m: int | None = None):
    """x [N, H]; topk_ids, topk_w [N, k]; gate, up kept [E, I, H]; down kept [E, H, I].
    Returns [N, H] (kernels/quant/naive.py: moe_experts)."""
    N, k = topk_ids.shape
    E, inter, H = check_experts(x, gate, up, down)
    if N == 0:
        return torch.zeros_like(x)
    x = x.contiguous()
    BM = block_m or launch.grouped_rows(N * k, E)
    pair_ids, block_expert = align(topk_ids.to(x.device), E, BM)
    weights = topk_w.reshape(-1).to(x.device, torch.float32).contiguous()
    h = torch.empty(N * k, inter, dtype=x.dtype, device=x.device)
    y = torch.empty(N * k, H, dtype=x.dtype, device=x.device)
    tiles = [(t.data.contiguous(), FORMATS[t.fmt][0]) for t in (gate, up, down)]
    grouped_gemm(x, tiles[0], tiles[1], h, pair_ids, block_expert, weights, k, inter, BM,
                 swiglu=True)
    grouped_gemm(h, tiles[2], tiles[2], y, pair_ids, block_expert, weights, k, H, BM,
                 swiglu=False)
    return y.view(N, k, H).sum(dim=1)

"""Partial rotary embedding (rotate-half layout) in Triton.

x [T, H, D]: the first R dims of each head rotate in pairs (i, i + R/2) by the
angles of cos / sin [T, R]; dims R.. pass through. A program takes BM rows of the
[T * H] (token, head) rows. Roundings follow naive.py: cos and sin are cast to x's
dtype and both products are rounded before their sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels import launch


@triton.jit
def _rotary_kernel(x, cos, sin, y, M, H, stride_xt, stride_xh, stride_ct, stride_st,
                   R: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BHALF: tl.constexpr,
                   BREST: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    mr = rows < M
    t = rows // H
    h = rows % H
    p_x = x + t[:, None] * stride_xt + h[:, None] * stride_xh
    p_y = y + rows[:, None] * D
    dt = x.dtype.element_ty
    i = tl.arange(0, BHALF)
    m = mr[:, None] & (i < R // 2)[None, :]
    x1 = tl.load(p_x + i[None, :], mask=m, other=0.).to(tl.float32)
    x2 = tl.load(p_x + (i + R // 2)[None, :], mask=m, other=0.).to(tl.float32)
    c1 = tl.load(cos + t[:, None] * stride_ct + i[None, :], mask=m, other=0.).to(dt).to(tl.float32)
    c2 = tl.load(cos + t[:, None] * stride_ct + (i + R // 2)[None, :], mask=m, other=0.)
    s1 = tl.load(sin + t[:, None] * stride_st + i[None, :], mask=m, other=0.).to(dt).to(tl.float32)
    s2 = tl.load(sin + t[:, None] * stride_st + (i + R // 2)[None, :], mask=m, other=0.)
    c2 = c2.to(dt).to(tl.float32)
    s2 = s2.to(dt).to(tl.float32)
    y1 = (x1 * c1).to(dt).to(tl.float32) - (x2 * s1).to(dt).to(tl.float32)
    y2 = (x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)
    tl.store(p_y + i[None, :], y1.to(dt), mask=m)
    tl.store(p_y + (i + R // 2)[None, :], y2.to(dt), mask=m)
    if R < D:
        j = R + tl.arange(0, BREST)
        m_rest = mr[:, None] & (j < D)[None, :]
        tl.store(p_y + j[None, :], tl.load(p_x + j[None, :], mask=m_rest), mask=m_rest)


def apply_rotary(x, cos, sin):
    """x [T, H, D]; cos, sin [T, R] with R <= D even. Rotates the first R dims of each
    head (pairs i and i + R/2), passes the rest through. Returns a new [T, H, D] tensor
    in x's dtype."""
    if x.dim() != 3 or cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] != x.shape[0]:
        raise ValueError(f"need x [T, H, D] and cos, sin [T, R], got {tuple(x.shape)}, "
                         f"{tuple(cos.shape)}, {tuple(sin.shape)}")
    T, H, D = x.shape
    R = cos.shape[1]
    if R % 2 or R > D or R == 0:
        raise ValueError(f"rotary dim must be even, positive and <= head dim {D}, got {R}")
    if x.stride(2) != 1:
        x = x.contiguous()
    cos = cos if cos.stride(1) == 1 else cos.contiguous()
    sin = sin if sin.stride(1) == 1 else sin.contiguous()
    y = torch.empty(T, H, D, dtype=x.dtype, device=x.device)
    M = T * H
    if M == 0:
        return y
    p = launch.rotary(launch.target(x.device), R, D)
    _rotary_kernel[(triton.cdiv(M, p["BM"]),)](
        x, cos, sin, y, M, H, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
        R=R, D=D, **p.kwargs())
    return y

"""RMSNorm, gated RMSNorm and L2 norm in Triton; statistics in fp32.

Each program normalizes BM rows of a [M, D] view. Roundings follow naive.py step
by step (the normalized value is cast to x's dtype before the weight multiplies
it, unless offset is set), so results match the reference bit for bit in fp32
and to one rounding in half precision.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels import launch


@triton.jit
def _rms_norm_kernel(x, z, w, y, M, D, eps, offset,
                     HAS_OFFSET: tl.constexpr, GATED: tl.constexpr, BM: tl.constexpr,
                     BD: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.arange(0, BD)
    m = (rows < M)[:, None] & (cols < D)[None, :]
    offs = rows[:, None] * D + cols[None, :]
    b_x = tl.load(x + offs, mask=m, other=0.).to(tl.float32)
    b_w = tl.load(w + cols, mask=cols < D, other=0.).to(tl.float32)[None, :]
    h = b_x * tl.rsqrt(tl.sum(b_x * b_x, axis=1) / D + eps)[:, None]
    if HAS_OFFSET:
        out = h * (b_w + offset)
    else:
        out = b_w * h.to(x.dtype.element_ty).to(tl.float32)
    if GATED:
        out = out.to(y.dtype.element_ty).to(tl.float32)        # weight * norm(x), rounded
        b_z = tl.load(z + offs, mask=m, other=0.).to(tl.float32)
        out = out * (b_z / (1. + tl.exp(-b_z)))
    tl.store(y + offs, out.to(y.dtype.element_ty), mask=m)


@triton.jit
def _l2_norm_kernel(x, y, M, D, eps, BM: tl.constexpr, BD: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.arange(0, BD)
    m = (rows < M)[:, None] & (cols < D)[None, :]
    offs = rows[:, None] * D + cols[None, :]
    b_x = tl.load(x + offs, mask=m, other=0.).to(tl.float32)
    out = b_x * tl.rsqrt(tl.sum(b_x * b_x, axis=1) + eps)[:, None]
    tl.store(y + offs, out, mask=m)


def _launch(x, z, weight, eps, offset, out_dtype):
    D = x.shape[-1]
    if weight.shape != (D,):
        raise ValueError(f"weight must be [{D}], got {tuple(weight.shape)}")
    if z is not None and z.shape != x.shape:
        raise ValueError(f"z must have x's shape {tuple(x.shape)}, got {tuple(z.shape)}")
    x2 = x.reshape(-1, D).contiguous()
    z2 = x2 if z is None else z.reshape(-1, D).contiguous()
    M = x2.shape[0]
    y = torch.empty(M, D, dtype=out_dtype, device=x.device)
    if M:
        p = launch.rows_norm(launch.target(x.device), D)
        _rms_norm_kernel[(triton.cdiv(M, p["BM"]),)](x2, z2, weight, y, M, D, float(eps),
                                                    float(offset), HAS_OFFSET=bool(offset),
                                                    GATED=z is not None, **p.kwargs())
    return y.view(x.shape)


def rms_norm(x, weight, eps, offset=0.0):
    """x [..., D]; weight [D]. Returns x / rms(x) * (weight + offset): x's dtype when
    offset is set, else the promotion of weight's and x's dtypes (as `weight * h`)."""
    out_dtype = x.dtype if offset else torch.promote_types(weight.dtype, x.dtype)
    return _launch(x, None, weight, eps, offset, out_dtype)


def gated_rms_norm(x, z, weight, eps):
    """(weight * norm(x)) * silu(z); x, z [..., D]; weight [D]. Returns x's dtype."""
    if torch.promote_types(weight.dtype, x.dtype) != x.dtype:
        raise ValueError(f"weight dtype {weight.dtype} would promote x's {x.dtype}")
    return _launch(x, z, weight, eps, 0.0, x.dtype)


def l2norm(x, eps=1e-6):
    """x / sqrt(sum(x^2) + eps) over the last dim; x [..., D]. Returns float32."""
    D = x.shape[-1]
    x2 = x.reshape(-1, D).contiguous()
    M = x2.shape[0]
    y = torch.empty(M, D, dtype=torch.float32, device=x.device)
    if M:
        p = launch.rows_norm(launch.target(x.device), D)
        _l2_norm_kernel[(triton.cdiv(M, p["BM"]),)](x2, y, M, D, float(eps), **p.kwargs())
    return y.view(x.shape)

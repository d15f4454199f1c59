"""Moving KV and recurrent state in Triton: write new tokens' K/V into their pages,
and copy whole pages or state cells between a pool and a contiguous buffer.

A pool is [P, *row] with each row contiguous: the KV pool's rows are pages
[n_attn, 2, B, Hkv, D], the conv / ssm pools' rows are cells. A copy program moves
BLOCK elements of one row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels import launch


@triton.jit
def _write_kv_kernel(k, v, pool, kv_index, layer, B, Hkv, stride_kt, stride_kh, stride_vt,
                     stride_vh, stride_p, stride_l, stride_kv, stride_b, stride_h,
                     D: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    at = tl.load(kv_index + i_t).to(tl.int64)
    h = tl.arange(0, BH)
    d = tl.arange(0, BD)
    m = (h < Hkv)[:, None] & (d < D)[None, :]
    b_k = tl.load(k + i_t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=m)
    b_v = tl.load(v + i_t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=m)
    p = pool + (at // B) * stride_p + layer * stride_l + (at % B) * stride_b \
        + h[:, None] * stride_h + d[None, :]
    tl.store(p, b_k.to(pool.dtype.element_ty), mask=m)
    tl.store(p + stride_kv, b_v.to(pool.dtype.element_ty), mask=m)


@triton.jit
def _copy_rows_kernel(src, dst, src_rows, dst_rows, row_numel, stride_src, stride_dst,
                      SRC_INDEXED: tl.constexpr, DST_INDEXED: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = j < row_numel
    rs = tl.load(src_rows + i).to(tl.int64) if SRC_INDEXED else i
    rd = tl.load(dst_rows + i).to(tl.int64) if DST_INDEXED else i
    x = tl.load(src + rs * stride_src + j, mask=m)
    tl.store(dst + rd * stride_dst + j, x.to(dst.dtype.element_ty), mask=m)


def write_kv(kv_pool, layer, kv_index, k, v):
    """Write k, v [N, Hkv, D] at flat positions kv_index int [N] (page * B + offset)
    of `layer` of kv_pool [P, n_attn, 2, B, Hkv, D], in place."""
    if kv_pool.dim() != 6:
        raise ValueError(f"need kv_pool [P, n_attn, 2, B, Hkv, D], got {tuple(kv_pool.shape)}")
    _, n_attn, _, B, Hkv, D = kv_pool.shape
    N = k.shape[0]
    if k.shape != (N, Hkv, D) or v.shape != (N, Hkv, D) or len(kv_index) != N:
        raise ValueError(f"need k, v [N, {Hkv}, {D}] and kv_index [N], got {tuple(k.shape)}, "
                         f"{tuple(v.shape)}, {len(kv_index)}")
    if not 0 <= layer < n_attn:
        raise ValueError(f"layer {layer} out of range for {n_attn} attention layers")
    if N == 0:
        return
    if k.stride(2) != 1 or v.stride(2) != 1:
        k, v = k.contiguous(), v.contiguous()
    kv_index = torch.as_tensor(kv_index, device=kv_pool.device).to(torch.int64)
    s = kv_pool.stride()
    p = launch.write_kv(launch.target(kv_pool.device), Hkv, D)
    _write_kv_kernel[(N,)](k, v, kv_pool, kv_index, layer, B, Hkv, k.stride(0), k.stride(1),
                           v.stride(0), v.stride(1), s[0], s[1], s[2], s[3], s[4], D=D,
                           **p.kwargs())


def _row_numel(pool: torch.Tensor) -> int:
    if pool.dim() < 2:
        raise ValueError(f"a pool is [P, ...], got {tuple(pool.shape)}")
    numel = pool[0].numel()
    if not pool[0].is_contiguous():
        raise ValueError("each row (page / cell) of the pool must be contiguous")
    return numel


def _copy(src, dst, src_rows, dst_rows, n: int) -> None:
    numel = _row_numel(src)
    assert _row_numel(dst) == numel
    p = launch.copy_rows(launch.target(dst.device), numel)
    dummy = torch.zeros(1, dtype=torch.int64, device=dst.device)
    _copy_rows_kernel[(n, triton.cdiv(numel, p["BLOCK"]))](
        src, dst, dummy if src_rows is None else src_rows, dummy if dst_rows is None else dst_rows,
        numel, src.stride(0), dst.stride(0), SRC_INDEXED=src_rows is not None,
        DST_INDEXED=dst_rows is not None, **p.kwargs())


def gather_rows(pool, ids):
    """Contiguous copy of rows `ids` (int [n]) of pool [P, ...]: [n, ...]."""
    ids = torch.as_tensor(ids, device=pool.device).to(torch.int64).reshape(-1)
    out = torch.empty(len(ids), *pool.shape[1:], dtype=pool.dtype, device=pool.device)
    if len(ids):
        _copy(pool, out, ids, None, len(ids))
    return out


def scatter_rows(pool, ids, rows):
    """Write rows [n, ...] into pool [P, ...] at ids (int [n]), in place, in the pool's
    dtype."""
    ids = torch.as_tensor(ids, device=pool.device).to(torch.int64).reshape(-1)
    if rows.shape != (len(ids), *pool.shape[1:]):
        raise ValueError(f"need rows [{len(ids)}, {', '.join(map(str, pool.shape[1:]))}], "
                         f"got {tuple(rows.shape)}")
    rows = rows.to(pool.device).contiguous()
    if len(ids):
        _copy(rows, pool, None, ids, len(ids))

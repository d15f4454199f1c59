"""Stages 2 and 3 of the chunked gated delta rule (chunk.py), after chunk_prepare.py.

2. `_state_kernel`, one program per (sequence, head, block of BV state columns),
   sequential over the sequence's chunks. The state S [K, BV] stays in registers as up to
   four [BK, BV] fp32 slabs; per chunk it stores S into h (the chunk's starting state,
   for stage 3), then
       v_new = u - w S                      -> v_new [N, H, V]
       S = S exp(gc_last) + k^T (v_new exp(gc_last - gc))
   and leaves the final S in the sequence's pool cell.
3. `_output_kernel`, one program per (chunk, head, block of BV columns), all chunks in
   parallel: o = scale (q exp(gc)) h + scale (q k^T exp(gc_i - gc_j), causal) v_new.

Dots take DT operands (v_new's dtype: bf16 on tensor cores for a bf16 model, fp32
exactly for an fp32 one) and accumulate in fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _state_kernel(k, w, u, gc, v_new, h, pool, state_idx, cu_seqlens, H, stride_pool,
                  K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr, PREC: tl.constexpr):
    i_n = tl.program_id(0)
    i_h = tl.program_id(1)
    i_v = tl.program_id(2)
    DT = w.dtype.element_ty
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    cell = tl.load(state_idx + i_n).to(tl.int64)
    # this sequence's first chunk among the step's (varlen.chunk_bounds' order)
    c0 = bos * 0
    for j in range(0, i_n):
        c0 += (tl.load(cu_seqlens + j + 1) - tl.load(cu_seqlens + j) + BT - 1) // BT
    rows = tl.arange(0, BT)
    ck = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    mv = cv < V
    m1 = (ck < K)[:, None] & mv[None, :]
    m2 = (ck + BK < K)[:, None] & mv[None, :]
    m3 = (ck + 2 * BK < K)[:, None] & mv[None, :]
    m4 = (ck + 3 * BK < K)[:, None] & mv[None, :]
    o_s = ck[:, None] * V + cv[None, :]
    p_s = pool + cell * stride_pool + i_h * K * V + o_s
    s1 = tl.load(p_s, mask=m1, other=0.)
    if K > BK:
        s2 = tl.load(p_s + BK * V, mask=m2, other=0.)
    if K > 2 * BK:
        s3 = tl.load(p_s + 2 * BK * V, mask=m3, other=0.)
    if K > 3 * BK:
        s4 = tl.load(p_s + 3 * BK * V, mask=m4, other=0.)
    # pointers advance by one chunk per step (loop counters are int32 in the interpreter)
    p_h = h + (c0 * H + i_h) * K * V + o_s
    o_k = (bos + rows)[:, None] * H * K + i_h * K + ck[None, :]
    o_v = (bos + rows)[:, None] * H * V + i_h * V + cv[None, :]
    p_k, p_w = k + o_k, w + o_k
    p_u, p_vn = u + o_v, v_new + o_v
    p_gc = gc + (bos + rows) * H + i_h
    for c in range(bos, eos, BT):
        left = eos - c                                   # valid rows of this chunk
        m = rows < left
        mk = m[:, None] & (ck < K)[None, :]
        tl.store(p_h, s1.to(DT), mask=m1)
        b_v = tl.load(p_u, mask=m[:, None] & mv[None, :], other=0.).to(tl.float32)
        b_v -= tl.dot(tl.load(p_w, mask=mk, other=0.), s1.to(DT), input_precision=PREC)
        if K > BK:
            tl.store(p_h + BK * V, s2.to(DT), mask=m2)
            b_v -= tl.dot(tl.load(p_w + BK, mask=m[:, None] & (ck + BK < K)[None, :], other=0.),
                          s2.to(DT), input_precision=PREC)
        if K > 2 * BK:
            tl.store(p_h + 2 * BK * V, s3.to(DT), mask=m3)
            b_v -= tl.dot(tl.load(p_w + 2 * BK, mask=m[:, None] & (ck + 2 * BK < K)[None, :],
                                  other=0.), s3.to(DT), input_precision=PREC)
        if K > 3 * BK:
            tl.store(p_h + 3 * BK * V, s4.to(DT), mask=m4)
            b_v -= tl.dot(tl.load(p_w + 3 * BK, mask=m[:, None] & (ck + 3 * BK < K)[None, :],
                                  other=0.), s4.to(DT), input_precision=PREC)
        tl.store(p_vn, b_v.to(DT), mask=m[:, None] & mv[None, :])
        b_gc = tl.load(p_gc, mask=m, other=0.)
        b_gl = tl.sum(tl.where(rows == tl.minimum(left, BT) - 1, b_gc, 0.), axis=0)
        b_vd = (b_v * tl.exp(b_gl - b_gc)[:, None]).to(DT)
        decay = tl.exp(b_gl)
        b_k = tl.load(p_k, mask=mk, other=0.).to(DT)
        s1 = s1 * decay + tl.dot(tl.trans(b_k), b_vd, input_precision=PREC)
        if K > BK:
            b_k = tl.load(p_k + BK, mask=m[:, None] & (ck + BK < K)[None, :], other=0.).to(DT)
            s2 = s2 * decay + tl.dot(tl.trans(b_k), b_vd, input_precision=PREC)
        if K > 2 * BK:
            b_k = tl.load(p_k + 2 * BK, mask=m[:, None] & (ck + 2 * BK < K)[None, :],
                          other=0.).to(DT)
            s3 = s3 * decay + tl.dot(tl.trans(b_k), b_vd, input_precision=PREC)
        if K > 3 * BK:
            b_k = tl.load(p_k + 3 * BK, mask=m[:, None] & (ck + 3 * BK < K)[None, :],
                          other=0.).to(DT)
            s4 = s4 * decay + tl.dot(tl.trans(b_k), b_vd, input_precision=PREC)
        p_h += H * K * V
        p_k += BT * H * K
        p_w += BT * H * K
        p_u += BT * H * V
        p_vn += BT * H * V
        p_gc += BT * H
    tl.debug_barrier()      # every thread has read the initial state before any writes
    tl.store(p_s, s1, mask=m1)
    if K > BK:
        tl.store(p_s + BK * V, s2, mask=m2)
    if K > 2 * BK:
        tl.store(p_s + 2 * BK * V, s3, mask=m3)
    if K > 3 * BK:
        tl.store(p_s + 3 * BK * V, s4, mask=m4)


@triton.jit
def _output_kernel(q, k, v_new, h, gc, o, chunk_bos, chunk_eos, scale, H,
                   K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                   BV: tl.constexpr, PREC: tl.constexpr):
    i_c = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    i_v = tl.program_id(2)
    DT = v_new.dtype.element_ty
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    eos = tl.load(chunk_eos + i_c).to(tl.int64)
    rows = tl.arange(0, BT)
    t = bos + rows
    m = t < eos
    cv = i_v * BV + tl.arange(0, BV)
    mv = m[:, None] & (cv < V)[None, :]
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for k0 in tl.static_range(0, K, BK):
        ck = k0 + tl.arange(0, BK)
        mk = m[:, None] & (ck < K)[None, :]
        o_k = (t[:, None] * H + i_h) * K + ck[None, :]
        b_q = tl.load(q + o_k, mask=mk, other=0.).to(DT)
        b_k = tl.load(k + o_k, mask=mk, other=0.).to(DT)
        b_h = tl.load(h + (i_c * H + i_h) * K * V + ck[:, None] * V + cv[None, :],
                      mask=(ck < K)[:, None] & (cv < V)[None, :], other=0.)
        b_o += tl.dot(b_q, b_h, input_precision=PREC)
        b_A += tl.dot(b_q, tl.trans(b_k), input_precision=PREC)
    b_gc = tl.load(gc + t * H + i_h, mask=m, other=0.)
    b_o *= tl.exp(b_gc)[:, None]
    causal = rows[:, None] >= rows[None, :]
    b_A = tl.where(causal, b_A * tl.exp(b_gc[:, None] - b_gc[None, :]), 0.)
    o_v = (t[:, None] * H + i_h) * V + cv[None, :]
    b_vn = tl.load(v_new + o_v, mask=mv, other=0.)
    b_o += tl.dot(b_A.to(DT), b_vn, input_precision=PREC)
    tl.store(o + o_v, (b_o * scale).to(o.dtype.element_ty), mask=mv)


def states(k, w, u, gc, v_new, h, pool, state_idx, cu_seqlens, n: int, launch) -> None:
    """Stage 2 for n sequences: v_new, h and the pool's cells, in place."""
    _, H, K = k.shape
    V = u.shape[2]
    grid = (n, H, triton.cdiv(V, launch["BV"]))
    _state_kernel[grid](k, w, u, gc, v_new, h, pool, state_idx, cu_seqlens, H, pool.stride(0),
                        K=K, V=V, **launch.kwargs())


def output(q, k, v_new, h, gc, o, chunk_bos, chunk_eos, scale: float, launch) -> None:
    """Stage 3: o [N, H, V] in place."""
    _, H, K = q.shape
    V = v_new.shape[2]
    grid = (chunk_bos.numel(), H, triton.cdiv(V, launch["BV"]))
    _output_kernel[grid](q, k, v_new, h, gc, o, chunk_bos, chunk_eos, scale, H, K=K, V=V,
                         **launch.kwargs())

"""Chunked gated delta rule prefill in Triton, over packed sequences (varlen).

Two kernels, the same math as naive.chunk_gated_delta_rule (chunk length BT):

1. `_prepare_kernel`, one program per (chunk, head), all chunks in parallel:
   gc = cumsum(g) inside the chunk, A = strictly-lower(beta_i k_i.k_j exp(gc_i - gc_j)),
   X = (I + A)^-1, u = X (v * beta), w = X (k * beta * exp(gc)).
   The inverse: forward substitution inside 16-row diagonal blocks gives
   D = (I + A_d)^-1; with N = D A_o (A_o the part below the diagonal blocks, so N is
   nilpotent), (I + A)^-1 = (I - N + N^2 - ...) D.
2. `_state_output_kernel`, one program per (sequence, head, block of V columns),
   sequential over the sequence's chunks with the state S [K, V] in registers:
   v_new = u - w S, o = scale (q exp(gc)) S + scale (q k^T decay, causal) v_new,
   S = S exp(gc_last) + (k exp(gc_last - gc))^T v_new.

Recurrent states live in a pool [num_slots, H, K, V] fp32; sequence n starts from
pool[state_indices[n]] and its final state is written back there (in place).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels.varlen import CHUNK, Varlen, chunk_bounds, device_cu, host_cu

SUB = 16  # rows of one diagonal block solved by forward substitution


@triton.jit
def _prepare_kernel(k, v, g, beta, w, u, gc, chunk_bos, chunk_eos, H,
                    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                    BV: tl.constexpr, SUB: tl.constexpr, PREC: tl.constexpr):
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    eos = tl.load(chunk_eos + i_c).to(tl.int64)
    rows = tl.arange(0, BT)
    t = bos + rows
    m = t < eos
    ck = tl.arange(0, BK)
    cv = tl.arange(0, BV)
    mk = m[:, None] & (ck < K)[None, :]
    mv = m[:, None] & (cv < V)[None, :]
    b_g = tl.load(g + t * H + i_h, mask=m, other=0.).to(tl.float32)
    b_beta = tl.load(beta + t * H + i_h, mask=m, other=0.).to(tl.float32)
    b_k = tl.load(k + (t[:, None] * H + i_h) * K + ck[None, :], mask=mk, other=0.).to(tl.float32)
    b_v = tl.load(v + (t[:, None] * H + i_h) * V + cv[None, :], mask=mv, other=0.).to(tl.float32)
    b_gc = tl.cumsum(b_g, axis=0)

    lower = rows[:, None] > rows[None, :]
    b_A = tl.dot(b_k * b_beta[:, None], tl.trans(b_k), input_precision=PREC)
    b_A = tl.where(lower, b_A * tl.exp(b_gc[:, None] - b_gc[None, :]), 0.)
    same = (rows // SUB)[:, None] == (rows // SUB)[None, :]
    b_Ad = tl.where(same, b_A, 0.)
    b_Ao = tl.where(same, 0., b_A)
    eye = tl.where(rows[:, None] == rows[None, :], 1., 0.)
    # D = (I + A_d)^-1, row i of every diagonal block at once
    b_D = eye
    for i in range(1, SUB):
        sel = ((rows % SUB) == i)[:, None]
        b_D = tl.where(sel, eye - tl.dot(tl.where(sel, b_Ad, 0.), b_D, input_precision="ieee"),
                       b_D)
    b_N = tl.dot(b_D, b_Ao, input_precision="ieee")
    b_P = eye
    for _ in tl.static_range(BT // SUB - 1):
        b_P = eye - tl.dot(b_N, b_P, input_precision="ieee")   # Horner: I - N + N^2 - ...
    b_X = tl.dot(b_P, b_D, input_precision="ieee")

    b_u = tl.dot(b_X, b_v * b_beta[:, None], input_precision=PREC)
    b_w = tl.dot(b_X, b_k * (b_beta * tl.exp(b_gc))[:, None], input_precision=PREC)
    tl.store(u + (t[:, None] * H + i_h) * V + cv[None, :], b_u, mask=mv)
    tl.store(w + (t[:, None] * H + i_h) * K + ck[None, :], b_w, mask=mk)
    tl.store(gc + t * H + i_h, b_gc, mask=m)


@triton.jit
def _state_output_kernel(q, k, w, u, gc, o, pool, state_idx, cu_seqlens, scale, H, stride_pool,
                         K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                         BV: tl.constexpr, PREC: tl.constexpr):
    i_n = tl.program_id(0)
    i_h = tl.program_id(1)
    i_v = tl.program_id(2)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    slot = tl.load(state_idx + i_n).to(tl.int64)
    rows = tl.arange(0, BT)
    ck = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    p_s = pool + slot * stride_pool + i_h * K * V + ck[:, None] * V + cv[None, :]
    m_s = (ck < K)[:, None] & (cv < V)[None, :]
    b_s = tl.load(p_s, mask=m_s, other=0.).to(tl.float32)        # [BK, BV]
    causal = rows[:, None] >= rows[None, :]
    # pointers advance by one chunk per step (loop counters are int32 in the interpreter)
    o_k = (bos + rows)[:, None] * H * K + i_h * K + ck[None, :]
    o_v = (bos + rows)[:, None] * H * V + i_h * V + cv[None, :]
    p_q, p_k, p_w = q + o_k, k + o_k, w + o_k
    p_u, p_o = u + o_v, o + o_v
    p_gc = gc + (bos + rows) * H + i_h
    for c0 in range(bos, eos, BT):
        left = eos - c0                                  # valid rows of this chunk
        m = rows < left
        mk = m[:, None] & (ck < K)[None, :]
        mv = m[:, None] & (cv < V)[None, :]
        b_q = tl.load(p_q, mask=mk, other=0.).to(tl.float32) * scale
        b_k = tl.load(p_k, mask=mk, other=0.).to(tl.float32)
        b_w = tl.load(p_w, mask=mk, other=0.)
        b_u = tl.load(p_u, mask=mv, other=0.)
        b_gc = tl.load(p_gc, mask=m, other=0.)
        b_gl = tl.sum(tl.where(rows == tl.minimum(left, BT) - 1, b_gc, 0.), axis=0)
        b_vn = b_u - tl.dot(b_w, b_s, input_precision=PREC)                       # [BT, BV]
        b_att = tl.dot(b_q, tl.trans(b_k), input_precision=PREC)
        b_att = tl.where(causal, b_att * tl.exp(b_gc[:, None] - b_gc[None, :]), 0.)
        b_o = tl.dot(b_q * tl.exp(b_gc)[:, None], b_s, input_precision=PREC)
        b_o += tl.dot(b_att, b_vn, input_precision=PREC)
        tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=mv)
        b_kd = b_k * tl.exp(b_gl - b_gc)[:, None]
        b_s = b_s * tl.exp(b_gl) + tl.dot(tl.trans(b_kd), b_vn, input_precision=PREC)
        p_q += BT * H * K
        p_k += BT * H * K
        p_w += BT * H * K
        p_u += BT * H * V
        p_o += BT * H * V
        p_gc += BT * H
    tl.debug_barrier()      # every thread has read the initial state before any writes
    tl.store(p_s, b_s, mask=m_s)


def _precision(*xs: torch.Tensor) -> str:
    """Full fp32 products for fp32 inputs; TF32 is already finer than bf16/fp16 inputs."""
    return "ieee" if all(x.dtype == torch.float32 for x in xs) else "tf32"


def check_varlen(q, k, v, g, beta, cu_seqlens, state_pool, state_indices) -> list[int]:
    """Validate the packed layout shared by the chunked and recurrent kernels; returns
    cu_seqlens as a host list."""
    if q.dim() != 3 or k.shape != q.shape or v.dim() != 3 or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"need q, k [N, H, K] and v [N, H, V], got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    N, H, K = q.shape
    V = v.shape[2]
    if g.shape != (N, H) or beta.shape != (N, H):
        raise ValueError(f"need g, beta [{N}, {H}], got {tuple(g.shape)}, {tuple(beta.shape)}")
    if state_pool.dim() != 4 or state_pool.shape[1:] != (H, K, V):
        raise ValueError(f"state_pool must be [slots, {H}, {K}, {V}], "
                         f"got {tuple(state_pool.shape)}")
    if state_pool.dtype != torch.float32:
        raise ValueError(f"state_pool must be float32, got {state_pool.dtype}")
    if state_pool.stride()[1:] != (K * V, V, 1):
        raise ValueError("state_pool must be contiguous inside a slot")
    cu = host_cu(cu_seqlens)
    if not cu or cu[0] != 0 or cu[-1] != N or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must rise from 0 to {N}, got {cu}")
    if len(state_indices) != len(cu) - 1:
        raise ValueError(f"need one state index per sequence: {len(cu) - 1}, "
                         f"got {len(state_indices)}")
    devices = {x.device for x in (q, k, v, g, beta, state_pool)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")
    return cu


def chunk_gated_delta_rule_varlen(q, k, v, g, beta, cu_seqlens, state_pool, state_indices,
                                  scale=None, chunk_size=64):
    """Chunked prefill of several packed sequences.

    q, k [N, H, K] (L2-normalized); v [N, H, V]; g [N, H] log decay; beta [N, H];
    cu_seqlens int [n + 1] or a Varlen (sequence i is tokens cu[i]:cu[i+1]); state_pool [S, H, K, V]
    fp32 (slots contiguous inside); state_indices int [n]. Sequence i starts from
    state_pool[state_indices[i]] and leaves its final state there. Returns o [N, H, V]
    in v's dtype.
    """
    cu = check_varlen(q, k, v, g, beta, cu_seqlens, state_pool, state_indices)
    if chunk_size not in (16, 32, 64, 128):
        raise ValueError(f"chunk_size must be 16, 32, 64 or 128, got {chunk_size}")
    N, H, K = q.shape
    V = v.shape[2]
    dev = q.device
    scale = K ** -0.5 if scale is None else float(scale)
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    o = torch.empty(N, H, V, dtype=v.dtype, device=dev)
    if N == 0:
        return o
    if isinstance(cu_seqlens, Varlen) and chunk_size == CHUNK:   # built with the step
        chunk_bos, chunk_eos = cu_seqlens.chunk_bos, cu_seqlens.chunk_eos
    else:
        bos, eos = chunk_bounds(cu, chunk_size)
        chunk_bos = torch.tensor(bos, dtype=torch.int32, device=dev)
        chunk_eos = torch.tensor(eos, dtype=torch.int32, device=dev)
    w = torch.empty(N, H, K, dtype=torch.float32, device=dev)
    u = torch.empty(N, H, V, dtype=torch.float32, device=dev)
    gc = torch.empty(N, H, dtype=torch.float32, device=dev)
    BK = max(16, triton.next_power_of_2(K))
    BV_all = max(16, triton.next_power_of_2(V))
    prec = _precision(q, k, v)
    _prepare_kernel[(chunk_bos.numel(), H)](
        k, v, g, beta, w, u, gc, chunk_bos, chunk_eos, H, K=K, V=V, BT=chunk_size, BK=BK,
        BV=BV_all, SUB=SUB, PREC=prec, num_warps=8 if max(BK, BV_all) >= 128 else 4)
    BV = min(BV_all, 64)
    cu_t = device_cu(cu_seqlens, dev)
    idx = torch.as_tensor(state_indices, device=dev).to(torch.int64)
    grid = (len(cu) - 1, H, triton.cdiv(V, BV))
    _state_output_kernel[grid](q, k, w, u, gc, o, state_pool, idx, cu_t, scale, H,
                               state_pool.stride(0), K=K, V=V, BT=chunk_size, BK=BK, BV=BV,
                               PREC=prec, num_warps=8 if BK >= 128 else 4)
    return o


def chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None, scale=None, chunk_size=64):
    """One sequence: q, k [T, H, K]; v [T, H, V]; g, beta [T, H]; initial_state [H, K, V]
    or None (zeros). Returns o [T, H, V] in v's dtype and the final state [H, K, V] fp32."""
    if q.dim() != 3 or v.dim() != 3:
        raise ValueError(f"need q [T, H, K] and v [T, H, V], got {tuple(q.shape)}, "
                         f"{tuple(v.shape)}")
    T, H, K = q.shape
    V = v.shape[2]
    pool = torch.zeros(1, H, K, V, dtype=torch.float32, device=q.device)
    if initial_state is not None:
        if initial_state.shape != (H, K, V):
            raise ValueError(f"initial_state must be [{H}, {K}, {V}], "
                             f"got {tuple(initial_state.shape)}")
        pool[0] = initial_state
    o = chunk_gated_delta_rule_varlen(q, k, v, g, beta, [0, T], pool, [0], scale, chunk_size)
    return o, pool[0]

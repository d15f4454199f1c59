"""Step-by-step gated delta rule in Triton: decode for a batch, or short prefills.

One program per (sequence, head, block of V columns) keeps S [K, BV] in registers
and walks the sequence's tokens; per token, as in naive.recurrent_gated_delta_rule:
    S = S exp(g_t); u = (v_t - k_t^T S) beta_t; S += k_t u^T; o_t = scale q_t^T S.
States live in a pool [num_cells, H, K, V] fp32 read and written in place, so a
server's decode step updates its sequences' cells without gathering them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels import launch
from ckptd.kernels.gated_delta.chunk import check_varlen
from ckptd.kernels.varlen import device_cu


@triton.jit
def _recurrent_kernel(q, k, v, g, beta, o, pool, state_idx, cu_seqlens, scale, H, stride_pool,
                      K: tl.constexpr, V: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr,
                      BV: tl.constexpr):
    i_n = tl.program_id(0)
    i_hb = tl.program_id(1)
    i_v = tl.program_id(2)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    cell = tl.load(state_idx + i_n).to(tl.int64)
    ch = i_hb * BH + tl.arange(0, BH)
    ck = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    mh = ch < H
    mk = mh[:, None] & (ck < K)[None, :]                                 # [BH, BK]
    mv = mh[:, None] & (cv < V)[None, :]                                 # [BH, BV]
    p_s = pool + cell * stride_pool + (ch * K * V)[:, None, None] \
        + (ck * V)[None, :, None] + cv[None, None, :]
    m_s = mk[:, :, None] & mv[:, None, :]
    b_s = tl.load(p_s, mask=m_s, other=0.).to(tl.float32)                 # [BH, BK, BV]
    # pointers advance by one token per step (loop counters are int32 in the interpreter)
    p_q = q + (bos * H + ch[:, None]) * K + ck[None, :]
    p_k = k + (bos * H + ch[:, None]) * K + ck[None, :]
    p_v = v + (bos * H + ch[:, None]) * V + cv[None, :]
    p_o = o + (bos * H + ch[:, None]) * V + cv[None, :]
    p_g = g + bos * H + ch
    p_beta = beta + bos * H + ch
    for _ in range(bos, eos):
        b_q = tl.load(p_q, mask=mk, other=0.).to(tl.float32) * scale
        b_k = tl.load(p_k, mask=mk, other=0.).to(tl.float32)
        b_v = tl.load(p_v, mask=mv, other=0.).to(tl.float32)
        b_g = tl.load(p_g, mask=mh, other=0.).to(tl.float32)
        b_beta = tl.load(p_beta, mask=mh, other=0.).to(tl.float32)
        b_s = b_s * tl.exp(b_g)[:, None, None]
        b_u = (b_v - tl.sum(b_k[:, :, None] * b_s, axis=1)) * b_beta[:, None]
        b_s = b_s + b_k[:, :, None] * b_u[:, None, :]
        b_o = tl.sum(b_q[:, :, None] * b_s, axis=1)
        tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=mv)
        p_q += H * K
        p_k += H * K
        p_v += H * V
        p_o += H * V
        p_g += H
        p_beta += H
    tl.debug_barrier()      # every thread has read the initial state before any writes
    tl.store(p_s, b_s, mask=m_s)


def recurrent_gated_delta_rule_varlen(q, k, v, g, beta, cu_seqlens, state_pool, state_indices,
                                      scale=None):
    """Several packed sequences, token by token.

    q, k [N, H, K] (L2-normalized); v [N, H, V]; g [N, H] log decay; beta [N, H];
    cu_seqlens int [n + 1]; state_pool [S, H, K, V] fp32 (cells contiguous inside);
    state_indices int [n]: sequence i starts from state_pool[state_indices[i]] and leaves
    its final state there. Returns o [N, H, V] in v's dtype.
    """
    cu = check_varlen(q, k, v, g, beta, cu_seqlens, state_pool, state_indices)
    N, H, K = q.shape
    V = v.shape[2]
    dev = q.device
    scale = K ** -0.5 if scale is None else float(scale)
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    o = torch.empty(N, H, V, dtype=v.dtype, device=dev)
    if N == 0:
        return o
    p = launch.gdn_recurrent(launch.target(dev), H, K, V)
    cu_t = device_cu(cu_seqlens, dev)
    idx = torch.as_tensor(state_indices, device=dev).to(torch.int64)
    grid = (len(cu) - 1, triton.cdiv(H, p["BH"]), triton.cdiv(V, p["BV"]))
    _recurrent_kernel[grid](q, k, v, g, beta, o, state_pool, idx, cu_t, scale, H,
                            state_pool.stride(0), K=K, V=V, **p.kwargs())
    return o


def gated_delta_decode(q, k, v, g, beta, state_pool, state_indices, scale=None):
    """One token for each of N sequences: q, k [N, H, K]; v [N, H, V]; g, beta [N, H];
    sequence n's state is state_pool[state_indices[n]], advanced in place. Returns o
    [N, H, V]."""
    if q.dim() != 3:
        raise ValueError(f"need q [N, H, K], got {tuple(q.shape)}")
    cu = list(range(q.shape[0] + 1))
    return recurrent_gated_delta_rule_varlen(q, k, v, g, beta, cu, state_pool, state_indices,
                                             scale)


def recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=None, scale=None):
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
    o = recurrent_gated_delta_rule_varlen(q, k, v, g, beta, [0, T], pool, [0], scale)
    return o, pool[0]

"""Causal depthwise conv1d in Triton: varlen prefill and batched decode.

y[t, c] = act(bias[c] + sum_j weight[c, j] * xs[t + j]) with xs = concat(state, x),
the state being the last K-1 inputs before the chunk (oldest first), as in naive.py.
States live in a pool [num_cells, C, K-1] read and written in place at each
sequence's state index. A program reads the old state before any program writes
the new one: prefill computes y in one launch and the new states in a second one;
the decode kernel loads its window, then syncs its threads, then stores.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels import launch
from ckptd.kernels.varlen import device_cu, host_cu


@triton.jit
def _silu(x, ACT: tl.constexpr):
    if ACT:
        x = x / (1. + tl.exp(-x))
    return x


@triton.jit
def _conv_prefill_kernel(x, w, bias, y, pool, state_idx, cu_seqlens, C, stride_pool,
                         KW: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                         HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    i_n = tl.program_id(0)
    i_t = tl.program_id(1)
    i_c = tl.program_id(2)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    if bos + i_t * BT < eos:
        cell = tl.load(state_idx + i_n).to(tl.int64)
        local = i_t * BT + tl.arange(0, BT)          # token index inside the sequence
        cc = i_c * BC + tl.arange(0, BC)
        mt = (bos + local) < eos
        mc = cc < C
        acc = tl.zeros((BT, BC), dtype=tl.float32)
        if HAS_BIAS:
            acc += tl.load(bias + cc, mask=mc, other=0.).to(tl.float32)[None, :]
        for j in tl.static_range(KW):
            src = local - (KW - 1) + j               # < 0: the input is in the carried state
            in_x = mt & (src >= 0)
            in_s = mt & (src < 0)
            xv = tl.load(x + (bos + src)[:, None] * C + cc[None, :],
                         mask=in_x[:, None] & mc[None, :], other=0.).to(tl.float32)
            sv = tl.load(pool + cell * stride_pool + cc[None, :] * (KW - 1)
                         + (src + KW - 1)[:, None], mask=in_s[:, None] & mc[None, :], other=0.)
            wj = tl.load(w + cc * KW + j, mask=mc, other=0.).to(tl.float32)
            acc += (xv + sv.to(tl.float32)) * wj[None, :]
        acc = _silu(acc, ACT)
        tl.store(y + (bos + local)[:, None] * C + cc[None, :], acc.to(y.dtype.element_ty),
                 mask=mt[:, None] & mc[None, :])


@triton.jit
def _conv_state_kernel(x, pool, state_idx, cu_seqlens, C, stride_pool,
                       KW: tl.constexpr, BS: tl.constexpr, BC: tl.constexpr):
    """New state = the last KW-1 inputs of concat(old state, this sequence's tokens)."""
    i_n = tl.program_id(0)
    i_c = tl.program_id(1)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    cell = tl.load(state_idx + i_n).to(tl.int64)
    j = tl.arange(0, BS)
    cc = i_c * BC + tl.arange(0, BC)
    mc = cc < C
    mj = j < KW - 1
    src = (eos - bos) - (KW - 1) + j
    m_x = mc[:, None] & (mj & (src >= 0))[None, :]
    m_s = mc[:, None] & (mj & (src < 0))[None, :]
    xv = tl.load(x + (bos + src)[None, :] * C + cc[:, None], mask=m_x, other=0.)
    p_s = pool + cell * stride_pool + cc[:, None] * (KW - 1)
    sv = tl.load(p_s + (src + KW - 1)[None, :], mask=m_s, other=0.)
    new = tl.where(m_x, xv.to(pool.dtype.element_ty), sv)
    tl.debug_barrier()      # every thread has read the old state before any writes
    tl.store(p_s + j[None, :], new, mask=mc[:, None] & mj[None, :])


@triton.jit
def _conv_update_kernel(x, w, bias, y, pool, state_idx, C, stride_pool,
                        KW: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr,
                        HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    i_n = tl.program_id(0).to(tl.int64)
    i_c = tl.program_id(1)
    cell = tl.load(state_idx + i_n).to(tl.int64)
    j = tl.arange(0, BW)                        # window: KW-1 state entries, then x
    cc = i_c * BC + tl.arange(0, BC)
    mc = cc < C
    p_s = pool + cell * stride_pool + cc[:, None] * (KW - 1)
    m_s = mc[:, None] & (j < KW - 1)[None, :]
    sv = tl.load(p_s + j[None, :], mask=m_s, other=0.)
    xv = tl.load(x + i_n * C + cc, mask=mc, other=0.)                   # [BC]
    last = (j == KW - 1)[None, :]
    win = tl.where(last, xv.to(tl.float32)[:, None], sv.to(tl.float32))  # [BC, BW]
    wv = tl.load(w + cc[:, None] * KW + j[None, :], mask=mc[:, None] & (j < KW)[None, :],
                 other=0.).to(tl.float32)
    acc = tl.sum(win * wv, axis=1)
    if HAS_BIAS:
        acc += tl.load(bias + cc, mask=mc, other=0.).to(tl.float32)
    acc = _silu(acc, ACT)
    tl.store(y + i_n * C + cc, acc.to(y.dtype.element_ty), mask=mc)
    # the new state is the window shifted left by one: old entries 1.., then x
    nxt = tl.load(p_s + (j + 1)[None, :], mask=mc[:, None] & (j + 1 < KW - 1)[None, :], other=0.)
    new = tl.where((j + 1 == KW - 1)[None, :], xv.to(pool.dtype.element_ty)[:, None], nxt)
    tl.debug_barrier()      # every thread has read the old state before any writes
    tl.store(p_s + j[None, :], new, mask=m_s)


def _activation(activation: str | None) -> bool:
    if activation is None:
        return False
    if activation in ("silu", "swish"):
        return True
    raise ValueError(f"unsupported activation {activation!r}")


def _check(x, weight, bias, pool) -> tuple[int, int]:
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[0] != x.shape[1]:
        raise ValueError(f"need x [N, C] and weight [C, K], got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}")
    C, KW = weight.shape
    if KW < 2:
        raise ValueError(f"conv kernel width must be at least 2, got {KW}")
    if bias is not None and bias.shape != (C,):
        raise ValueError(f"bias must be [{C}], got {tuple(bias.shape)}")
    if pool.dim() != 3 or pool.shape[1:] != (C, KW - 1) or pool.stride()[1:] != (KW - 1, 1):
        raise ValueError(f"state pool must be [cells, {C}, {KW - 1}], contiguous inside a "
                         f"cell, got {tuple(pool.shape)} strides {pool.stride()}")
    return C, KW


def causal_conv1d_varlen(x, weight, bias, cu_seqlens, conv_pool, state_indices,
                         activation="silu"):
    """Prefill of packed sequences: x [N, C]; weight [C, K]; bias [C] or None;
    cu_seqlens int [n + 1]; conv_pool [S, C, K-1]; state_indices int [n]. Sequence i
    starts from conv_pool[state_indices[i]] and leaves its new state there. Returns
    y [N, C] in x's dtype."""
    C, KW = _check(x, weight, bias, conv_pool)
    act = _activation(activation)
    cu = host_cu(cu_seqlens)
    N = x.shape[0]
    if not cu or cu[0] != 0 or cu[-1] != N or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must rise from 0 to {N}, got {cu}")
    if len(state_indices) != len(cu) - 1:
        raise ValueError(f"need one state index per sequence: {len(cu) - 1}, "
                         f"got {len(state_indices)}")
    dev = x.device
    x, weight = x.contiguous(), weight.contiguous()
    y = torch.empty(N, C, dtype=x.dtype, device=dev)
    n = len(cu) - 1
    if n == 0:
        return y
    max_len = max(b - a for a, b in zip(cu, cu[1:]))
    t = launch.target(dev)
    p, ps = launch.conv_prefill(t, C), launch.conv_state(t, C, KW)
    cu_t = device_cu(cu_seqlens, dev)
    idx = torch.as_tensor(state_indices, device=dev).to(torch.int64)
    b = bias if bias is not None else weight
    grid = (n, max(1, triton.cdiv(max_len, p["BT"])), triton.cdiv(C, p["BC"]))
    _conv_prefill_kernel[grid](x, weight, b, y, conv_pool, idx, cu_t, C, conv_pool.stride(0),
                               KW=KW, HAS_BIAS=bias is not None, ACT=act, **p.kwargs())
    _conv_state_kernel[(n, triton.cdiv(C, ps["BC"]))](x, conv_pool, idx, cu_t, C,
                                                      conv_pool.stride(0), KW=KW, **ps.kwargs())
    return y


def causal_conv1d_update_cells(x, conv_pool, state_indices, weight, bias=None,
                               activation="silu"):
    """One decode token per sequence: x [N, C]; conv_pool [S, C, K-1]; state_indices int
    [N]. Advances conv_pool[state_indices[n]] in place; returns y [N, C] in x's dtype."""
    C, KW = _check(x, weight, bias, conv_pool)
    act = _activation(activation)
    N = x.shape[0]
    if len(state_indices) != N:
        raise ValueError(f"need one state index per token: {N}, got {len(state_indices)}")
    x, weight = x.contiguous(), weight.contiguous()
    y = torch.empty(N, C, dtype=x.dtype, device=x.device)
    if N == 0:
        return y
    p = launch.conv_update(launch.target(x.device), C, KW)
    idx = torch.as_tensor(state_indices, device=x.device).to(torch.int64)
    b = bias if bias is not None else weight
    _conv_update_kernel[(N, triton.cdiv(C, p["BC"]))](
        x, weight, b, y, conv_pool, idx, C, conv_pool.stride(0), KW=KW,
        HAS_BIAS=bias is not None, ACT=act, **p.kwargs())
    return y


def causal_conv1d(x, weight, bias=None, initial_state=None, activation="silu"):
    """One sequence: x [T, C]; weight [C, K]; initial_state [C, K-1] or None (zeros).
    Returns y [T, C] and the final state [C, K-1], both in x's dtype."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"need x [T, C] and weight [C, K], got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}")
    C, KW = weight.shape
    pool = torch.zeros(1, C, KW - 1, dtype=x.dtype, device=x.device)
    if initial_state is not None:
        if initial_state.shape != (C, KW - 1):
            raise ValueError(f"initial_state must be [{C}, {KW - 1}], "
                             f"got {tuple(initial_state.shape)}")
        pool[0] = initial_state
    y = causal_conv1d_varlen(x, weight, bias, [0, x.shape[0]], pool, [0], activation)
    return y, pool[0]


def causal_conv1d_update(x, conv_state, weight, bias=None, activation="silu"):
    """One decode step for a batch: x [N, C]; conv_state [N, C, K-1] (not modified).
    Returns y [N, C] and the new state [N, C, K-1] in x's dtype."""
    if conv_state.dim() != 3:
        raise ValueError(f"need conv_state [N, C, K-1], got {tuple(conv_state.shape)}")
    pool = conv_state.to(x.dtype).contiguous().clone()
    y = causal_conv1d_update_cells(x, pool, list(range(pool.shape[0])), weight, bias, activation)
    return y, pool

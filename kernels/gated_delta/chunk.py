"""Chunked gated delta rule prefill in Triton, over packed sequences (varlen).

The same math as naive.chunk_gated_delta_rule (chunk length BT), in three stages whose
launches come from kernels/launch.py (each fits the shared memory of every target at
Qwen3.5's K = V = 128, checked by the compile gate, tests/kernels/test_compile_gate.py):

1. chunk_prepare.py, all chunks in parallel: k.k^T, the triangular solve, w and u.
2. chunk_state.py `_state_kernel`, each sequence's chunks in order: the state before
   every chunk (h), the corrected values v_new, the final state into the pool.
3. chunk_state.py `_output_kernel`, all chunks in parallel: o from h and v_new.

Dots take operands in v's dtype (bf16 on a bf16 model, on tensor cores) and accumulate
in fp32; so do w, u, v_new and h. Recurrent states live in a pool [num_cells, H, K, V]
fp32; sequence n starts from pool[state_indices[n]] and its final state is written back
there (in place).
"""

from __future__ import annotations

import torch

from ckptd.kernels import launch
from ckptd.kernels.gated_delta import chunk_prepare, chunk_state
from ckptd.kernels.varlen import CHUNK, Varlen, chunk_bounds, device_cu, host_cu


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
        raise ValueError(f"state_pool must be [cells, {H}, {K}, {V}], "
                         f"got {tuple(state_pool.shape)}")
    if state_pool.dtype != torch.float32:
        raise ValueError(f"state_pool must be float32, got {state_pool.dtype}")
    if state_pool.stride()[1:] != (K * V, V, 1):
        raise ValueError("state_pool must be contiguous inside a cell")
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
    fp32 (cells contiguous inside); state_indices int [n]. Sequence i starts from
    state_pool[state_indices[i]] and leaves its final state there. Returns o [N, H, V]
    in v's dtype.
    """
    cu = check_varlen(q, k, v, g, beta, cu_seqlens, state_pool, state_indices)
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"chunk_size must be 16, 32 or 64, got {chunk_size}")
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
    dt = v.dtype                                   # the dots' operands
    t = launch.target(dev)
    w = torch.empty(N, H, K, dtype=dt, device=dev)
    u = torch.empty(N, H, V, dtype=dt, device=dev)
    v_new = torch.empty(N, H, V, dtype=dt, device=dev)
    gc = torch.empty(N, H, dtype=torch.float32, device=dev)
    h = torch.empty(chunk_bos.numel(), H, K, V, dtype=dt, device=dev)
    chunk_prepare.prepare(k, v, g, beta, w, u, gc, chunk_bos, chunk_eos,
                          launch.gdn_prepare(t, K, V, dt, chunk_size))
    idx = torch.as_tensor(state_indices, device=dev).to(torch.int64)
    chunk_state.states(k, w, u, gc, v_new, h, state_pool, idx, device_cu(cu_seqlens, dev),
                       len(cu) - 1, launch.gdn_state(t, K, V, dt, chunk_size))
    chunk_state.output(q, k, v_new, h, gc, o, chunk_bos, chunk_eos, scale,
                       launch.gdn_output(t, K, V, dt, chunk_size))
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

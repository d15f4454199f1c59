"""Packed-sequence forms of the gated delta rule, plain torch: a loop over naive.py.

The references for chunk.chunk_gated_delta_rule_varlen and
fused_recurrent.recurrent_gated_delta_rule_varlen / gated_delta_decode; same
arguments, same in-place update of the state pool.
"""

from __future__ import annotations

import torch

from ckptd.kernels.gated_delta import naive


def _loop(rule, q, k, v, g, beta, cu_seqlens, state_pool, state_indices, scale):
    cu = [int(c) for c in (cu_seqlens.tolist() if torch.is_tensor(cu_seqlens) else cu_seqlens)]
    if len(state_indices) != len(cu) - 1:
        raise ValueError(f"need one state index per sequence: {len(cu) - 1}, "
                         f"got {len(state_indices)}")
    o = torch.empty(q.shape[0], *v.shape[1:], dtype=v.dtype, device=v.device)
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        slot = int(state_indices[i])
        o[a:b], state_pool[slot] = rule(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b],
                                        state_pool[slot], scale)
    return o


def chunk_gated_delta_rule_varlen(q, k, v, g, beta, cu_seqlens, state_pool, state_indices,
                                  scale=None, chunk_size=64):
    """q, k [N, H, K]; v [N, H, V]; g, beta [N, H]; cu_seqlens int [n + 1]; state_pool
    [S, H, K, V] fp32 updated in place at state_indices int [n]. Returns o [N, H, V]."""
    rule = lambda *a: naive.chunk_gated_delta_rule(*a, chunk_size=chunk_size)  # noqa: E731
    return _loop(rule, q, k, v, g, beta, cu_seqlens, state_pool, state_indices, scale)


def recurrent_gated_delta_rule_varlen(q, k, v, g, beta, cu_seqlens, state_pool, state_indices,
                                      scale=None):
    """Same as chunk_gated_delta_rule_varlen, token by token."""
    return _loop(naive.recurrent_gated_delta_rule, q, k, v, g, beta, cu_seqlens, state_pool,
                 state_indices, scale)


def gated_delta_decode(q, k, v, g, beta, state_pool, state_indices, scale=None):
    """One token for each of N sequences: q, k [N, H, K]; v [N, H, V]; g, beta [N, H];
    state_pool[state_indices[n]] advanced in place. Returns o [N, H, V]."""
    return recurrent_gated_delta_rule_varlen(q, k, v, g, beta, list(range(q.shape[0] + 1)),
                                             state_pool, state_indices, scale)

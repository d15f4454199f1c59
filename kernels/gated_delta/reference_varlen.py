"""Packed-sequence forms of the gated delta rule, plain torch: a loop over naive.py.

The references for chunk.chunk_gated_delta_rule_varlen and
fused_recurrent.recurrent_gated_delta_rule_varlen / gated_delta_decode; same
arguments, same in-place update of the state pool.
"""

from __future__ import annotations

import torch

from ckptd.kernels.gated_delta import naive
from ckptd.kernels.varlen import host_cu


def _loop(rule, q, k, v, g, beta, cu_seqlens, state_pool, state_indices, scale):
    cu = host_cu(cu_seqlens)
    if len(state_indices) != len(cu) - 1:
        raise ValueError(f"need one state index per sequence: {len(cu) - 1}, "
                         f"got {len(state_indices)}")
    o = torch.empty(q.shape[0], *v.shape[1:], dtype=v.dtype, device=v.device)
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        cell = int(state_indices[i])
        o[a:b], state_pool[cell] = rule(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b],
                                        state_pool[cell], scale)
    return o


def chunk_gated_delta_rule_varlen(q, k, v, g, beta, cu_seqlens, state_pool, state_indices,
                                  scale=None, chunk_size=64):
    """q, k [N, H, K]; v [N, H, V]; g, beta [N, H]; cu_seqlens int [n + 1]; state_pool
    [S, H, K, V] fp32 updated in place at state_indices int [n]. Returns o [N, H, V]."""
    def rule(q, *rest):      # one token: the same rule, step by step (no chunk padding)
        if q.shape[0] == 1:
            return naive.recurrent_gated_delta_rule(q, *rest)
        return naive.chunk_gated_delta_rule(q, *rest, chunk_size=chunk_size)
    return _loop(rule, q, k, v, g, beta, cu_seqlens, state_pool, state_indices, scale)


def recurrent_gated_delta_rule_varlen(q, k, v, g, beta, cu_seqlens, state_pool, state_indices,
                                      scale=None):
    """Same as chunk_gated_delta_rule_varlen, token by token."""
    if host_cu(cu_seqlens) == list(range(q.shape[0] + 1)) and q.shape[0] > 1:
        return _decode(q, k, v, g, beta, state_pool, state_indices, scale)
    return _loop(naive.recurrent_gated_delta_rule, q, k, v, g, beta, cu_seqlens, state_pool,
                 state_indices, scale)


def _decode(q, k, v, g, beta, state_pool, state_indices, scale):
    """One token of each of N sequences in one call: their heads side by side, as one
    sequence of N * H heads (the rule treats heads independently)."""
    N, H, K = q.shape
    V = v.shape[2]
    idx = torch.as_tensor(state_indices, device=q.device).to(torch.int64)
    o, s = naive.recurrent_gated_delta_rule(
        q.reshape(1, N * H, K), k.reshape(1, N * H, K), v.reshape(1, N * H, V),
        g.reshape(1, N * H), beta.reshape(1, N * H),
        state_pool[idx].reshape(N * H, K, V), scale)
    state_pool[idx] = s.view(N, H, K, V)
    return o.view(N, H, V)


def gated_delta_decode(q, k, v, g, beta, state_pool, state_indices, scale=None):
    """One token for each of N sequences: q, k [N, H, K]; v [N, H, V]; g, beta [N, H];
    state_pool[state_indices[n]] advanced in place. Returns o [N, H, V]."""
    return recurrent_gated_delta_rule_varlen(q, k, v, g, beta, list(range(q.shape[0] + 1)),
                                             state_pool, state_indices, scale)

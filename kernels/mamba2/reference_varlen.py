"""Packed-sequence forms of the Mamba2 scan, plain torch: a loop over naive.py.

The references for chunk.ssd_chunk_varlen and fused_recurrent.ssd_recurrent_varlen;
same arguments, same in-place update of the state pool.
"""

from __future__ import annotations

import torch

from ckptd.kernels.mamba2 import naive
from ckptd.kernels.varlen import check_cu, one_token_each


def ssd_varlen(x, dt, A, B, C, D, cu_seqlens, state_pool, state_indices, chunked=True,
               chunk_size=64):
    """x [N, H, P]; dt [N, H]; A [H]; B, C [N, G, N_s]; D [H] or None; cu_seqlens int
    [n + 1]; state_pool [S, H, P, N_s] fp32 updated in place at state_indices int [n].
    Returns y [N, H, P]. chunked: the chunk-parallel form for sequences of more than
    one token, else token by token."""
    cu = check_cu(cu_seqlens, x.shape[0], state_indices)
    if one_token_each(cu):
        return _decode(x, dt, A, B, C, D, state_pool, state_indices)
    y = torch.empty_like(x)
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        cell = int(state_indices[i])
        if chunked and b - a > 1:
            y[a:b], state_pool[cell] = naive.ssd_chunked(
                x[a:b], dt[a:b], A, B[a:b], C[a:b], D, state_pool[cell], chunk_size)
        else:
            y[a:b], state_pool[cell] = naive.ssd_recurrent(
                x[a:b], dt[a:b], A, B[a:b], C[a:b], D, state_pool[cell])
    return y


def _decode(x, dt, A, B, C, D, state_pool, state_indices):
    """One token of each of n sequences in one call, their states gathered and put back:
    the rule is per head, so n sequences of H heads are one token of n * H heads."""
    n, H, P = x.shape
    G, Ns = B.shape[1:]
    idx = torch.as_tensor(state_indices, device=x.device).to(torch.int64)
    y, s = naive.ssd_recurrent(
        x.reshape(1, n * H, P), dt.reshape(1, n * H), A.repeat(n),
        B.reshape(1, n * G, Ns), C.reshape(1, n * G, Ns), None if D is None else D.repeat(n),
        state_pool[idx].reshape(n * H, P, Ns))
    state_pool[idx] = s.view(n, H, P, Ns)
    return y.view(n, H, P)

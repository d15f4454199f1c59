"""Packed-sequence form of the Mamba (v1) selective scan, plain torch: a loop over
naive.py. The reference for triton_scan.selective_scan_varlen; same arguments, same
in-place update of the state pool.
"""

from __future__ import annotations

import torch

from ckptd.kernels.mamba1 import naive
from ckptd.kernels.varlen import check_cu, one_token_each


def selective_scan_varlen(x, dt, A, B, C, Dskip, cu_seqlens, state_pool, state_indices):
    """x [N_tok, D]; dt [N_tok, D]; A [D, N]; B, C [N_tok, N]; Dskip [D] or None;
    cu_seqlens int [n + 1]; state_pool [S, D, N] fp32 updated in place at
    state_indices int [n]. Returns y [N_tok, D]."""
    cu = check_cu(cu_seqlens, x.shape[0], state_indices)
    if one_token_each(cu):
        return _decode(x, dt, A, B, C, Dskip, state_pool, state_indices)
    y = torch.empty_like(x)
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        cell = int(state_indices[i])
        y[a:b], state_pool[cell] = naive.selective_scan(x[a:b], dt[a:b], A, B[a:b], C[a:b],
                                                        Dskip, state_pool[cell])
    return y


def _decode(x, dt, A, B, C, Dskip, state_pool, state_indices):
    """One token of each of n sequences at once, their states gathered and put back."""
    naive.check(x, dt, A, B, C, Dskip)
    idx = torch.as_tensor(state_indices, device=x.device).to(torch.int64)
    h = state_pool[idx].float()                                       # [n, D, N]
    dtf = dt.float()
    h = torch.exp(dtf[:, :, None] * A.float()) * h \
        + (dtf * x.float())[:, :, None] * B.float()[:, None, :]
    y = (h @ C.float()[:, :, None])[..., 0]
    if Dskip is not None:
        y = y + Dskip.float() * x.float()
    state_pool[idx] = h.to(state_pool.dtype)
    return y.to(x.dtype)

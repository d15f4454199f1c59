"""Packed-sequence and state-pool forms of the causal conv1d, plain torch: loops over
naive.py. The references for triton_conv.causal_conv1d_varlen and
triton_conv.causal_conv1d_update_cells; same arguments, same in-place updates.
"""

from __future__ import annotations

import torch

from ckptd.kernels.conv1d import naive
from ckptd.kernels.varlen import host_cu


def causal_conv1d_varlen(x, weight, bias, cu_seqlens, conv_pool, state_indices,
                         activation="silu"):
    """x [N, C]; weight [C, K]; cu_seqlens int [n + 1]; conv_pool [S, C, K-1] updated in
    place at state_indices int [n]. Returns y [N, C]."""
    cu = host_cu(cu_seqlens)
    if len(state_indices) != len(cu) - 1:
        raise ValueError(f"need one state index per sequence: {len(cu) - 1}, "
                         f"got {len(state_indices)}")
    y = torch.empty_like(x)
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        cell = int(state_indices[i])
        y[a:b], conv_pool[cell] = naive.causal_conv1d(x[a:b], weight, bias, conv_pool[cell],
                                                      activation)
    return y


def causal_conv1d_update_cells(x, conv_pool, state_indices, weight, bias=None,
                               activation="silu"):
    """x [N, C]; conv_pool [S, C, K-1] advanced in place at state_indices int [N].
    Returns y [N, C]."""
    idx = torch.as_tensor(state_indices, device=x.device).to(torch.int64)
    y, new = naive.causal_conv1d_update(x, conv_pool[idx], weight, bias, activation)
    conv_pool[idx] = new.to(conv_pool.dtype)
    return y

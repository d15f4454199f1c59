"""Causal depthwise conv1d with a carried state, plain torch.

The state is the last K-1 inputs of the sequence so far (oldest first), so a
sequence can be convolved in chunks: chunked and one-shot results are equal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _act(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return y
    if activation in ("silu", "swish"):
        return F.silu(y)
    raise ValueError(f"unsupported activation {activation!r}")


def causal_conv1d(x, weight, bias=None, initial_state=None, activation="silu"):
    """x [T, C]; weight [C, K]; bias [C] or None; initial_state [C, K-1] or None (zeros).

    Returns y [T, C] (x's dtype) and final_state [C, K-1] (x's dtype): the last K-1
    inputs of concat(initial_state, x).
    """
    T, C = x.shape
    K = weight.shape[1]
    if initial_state is None:
        initial_state = torch.zeros(C, K - 1, dtype=x.dtype, device=x.device)
    full = torch.cat([initial_state.to(x.dtype), x.t()], dim=1)          # [C, K-1+T]
    y = F.conv1d(full.float()[None], weight.float()[:, None, :],
                 None if bias is None else bias.float(), groups=C)[0]   # [C, T]
    y = _act(y, activation).t().to(x.dtype)
    return y, full[:, full.shape[1] - (K - 1):].clone()


def causal_conv1d_update(x, conv_state, weight, bias=None, activation="silu"):
    """One decode step for a batch. x [N, C]; conv_state [N, C, K-1].

    Returns y [N, C] and the new state [N, C, K-1] (the input is not modified).
    """
    full = torch.cat([conv_state.to(x.dtype), x[:, :, None]], dim=2)     # [N, C, K]
    y = (full.float() * weight.float()[None]).sum(-1)
    if bias is not None:
        y = y + bias.float()
    return _act(y, activation).to(x.dtype), full[:, :, 1:].clone()

"""Mamba (v1) selective scan, plain torch. All math in fp32.

Per channel d with a state h [N] and its own decay rates A[d] [N], per token t:
    h   = exp(dt_t[d] A[d]) * h + dt_t[d] x_t[d] B_t
    y_t = h . C_t + D[d] x_t[d]
dt is the time step after the model's softplus (>= 0) and A = -exp(A_log) (< 0);
the gate silu(z) and the projections are the model's (Jamba's mamba layers).

Shapes: x [T, D]; dt [T, D]; A [D, N]; B, C [T, N]; D [D] or None ("Dskip" below,
to keep D the channel count); initial_state [D, N] or None (zeros). Returns
y [T, D] in x's dtype and the final state [D, N] fp32.
"""

from __future__ import annotations

import torch

_BLOCK = 256       # tokens whose decays and inputs are formed at once (memory: T x D x N)


def check(x, dt, A, B, C, Dskip=None) -> tuple[int, int, int]:
    """(T, D, N); ValueError naming what is inconsistent."""
    if x.dim() != 2 or A.dim() != 2 or B.dim() != 2:
        raise ValueError(f"need x [T, D], A [D, N] and B, C [T, N], got {tuple(x.shape)}, "
                         f"{tuple(A.shape)}, {tuple(B.shape)}")
    T, D = x.shape
    N = A.shape[1]
    if A.shape[0] != D or dt.shape != (T, D) or B.shape != (T, N) or C.shape != (T, N):
        raise ValueError(f"need dt [{T}, {D}], A [{D}, N], B, C [{T}, N], got "
                         f"{tuple(dt.shape)}, {tuple(A.shape)}, {tuple(B.shape)}, "
                         f"{tuple(C.shape)}")
    if Dskip is not None and Dskip.shape != (D,):
        raise ValueError(f"need D [{D}], got {tuple(Dskip.shape)}")
    return T, D, N


def start_state(initial_state, D, N, device) -> torch.Tensor:
    """The initial state [D, N] fp32 (a copy), zeros for None."""
    if initial_state is None:
        return torch.zeros(D, N, dtype=torch.float32, device=device)
    if tuple(initial_state.shape) != (D, N):
        raise ValueError(f"initial_state must be [{D}, {N}], got {tuple(initial_state.shape)}")
    return initial_state.float().clone()


def selective_scan(x, dt, A, B, C, Dskip=None, initial_state=None):
    """Token by token. Returns (y [T, D], state [D, N] fp32)."""
    T, D, N = check(x, dt, A, B, C, Dskip)
    h = start_state(initial_state, D, N, x.device)
    xf, dtf, Af, Bf, Cf = (t.float() for t in (x, dt, A, B, C))
    y = torch.empty(T, D, dtype=torch.float32, device=x.device)
    for a in range(0, T, _BLOCK):
        b = min(T, a + _BLOCK)
        decay = torch.exp(dtf[a:b, :, None] * Af)                      # [t, D, N]
        inp = (dtf[a:b] * xf[a:b])[:, :, None] * Bf[a:b, None, :]        # [t, D, N]
        for t in range(b - a):
            h = decay[t] * h + inp[t]
            y[a + t] = h @ Cf[a + t]
    if Dskip is not None:
        y = y + Dskip.float() * xf
    return y.to(x.dtype), h

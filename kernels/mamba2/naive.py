"""Mamba2's selective state space scan (SSD), plain torch. All math in fp32.

Per head h with a scalar decay and a state S [P, N] (head_dim x state_size), per
token t, with B and C of the head's group g = h // (H / G):
    S   = S * exp(dt_t A_h) + dt_t x_t B_t^T        (x_t [P], B_t [N])
    y_t = S C_t + D_h x_t
dt is the time step after the model's softplus and clamp (>= 0) and A = -exp(A_log)
(< 0); the gate and the norm after the scan are the model's.

Shapes: x [T, H, P]; dt [T, H]; A [H]; B, C [T, G, N]; D [H] or None;
initial_state [H, P, N] or None (zeros). Both forms return y [T, H, P] in x's
dtype and the final state [H, P, N] fp32.
"""

from __future__ import annotations

import torch


def check(x, dt, A, B, C, D=None) -> tuple[int, int, int, int, int]:
    """(T, H, P, G, N); ValueError naming what is inconsistent."""
    if x.dim() != 3 or B.dim() != 3 or C.shape != B.shape:
        raise ValueError(f"need x [T, H, P] and B, C [T, G, N], got {tuple(x.shape)}, "
                         f"{tuple(B.shape)}, {tuple(C.shape)}")
    T, H, P = x.shape
    G, N = B.shape[1:]
    if B.shape[0] != T or G == 0 or H % G:
        raise ValueError(f"B, C need {T} tokens and a group count dividing {H} heads, "
                         f"got {tuple(B.shape)}")
    if dt.shape != (T, H) or A.shape != (H,) or (D is not None and D.shape != (H,)):
        raise ValueError(f"need dt [{T}, {H}], A [{H}] and D [{H}], got {tuple(dt.shape)}, "
                         f"{tuple(A.shape)}, {None if D is None else tuple(D.shape)}")
    return T, H, P, G, N


def start_state(initial_state, H, P, N, device) -> torch.Tensor:
    """The initial state [H, P, N] fp32 (a copy), zeros for None."""
    if initial_state is None:
        return torch.zeros(H, P, N, dtype=torch.float32, device=device)
    if tuple(initial_state.shape) != (H, P, N):
        raise ValueError(f"initial_state must be [{H}, {P}, {N}], "
                         f"got {tuple(initial_state.shape)}")
    return initial_state.float().clone()


def _per_head(B: torch.Tensor, H: int) -> torch.Tensor:
    """[T, G, N] -> [T, H, N]: each head reads its group's row."""
    return B.float().repeat_interleave(H // B.shape[1], dim=1)


def ssd_recurrent(x, dt, A, B, C, D=None, initial_state=None):
    """Token by token (the definition). Returns (y [T, H, P], state [H, P, N] fp32)."""
    T, H, P, G, N = check(x, dt, A, B, C, D)
    S = start_state(initial_state, H, P, N, x.device)
    xf, dtf, Af = x.float(), dt.float(), A.float()
    Bh, Ch = _per_head(B, H), _per_head(C, H)
    y = torch.empty(T, H, P, dtype=torch.float32, device=x.device)
    for t in range(T):
        S = S * torch.exp(dtf[t] * Af)[:, None, None] \
            + (dtf[t][:, None] * xf[t])[:, :, None] * Bh[t][:, None, :]
        y[t] = (S * Ch[t][:, None, :]).sum(-1)
    if D is not None:
        y = y + D.float()[None, :, None] * xf
    return y.to(x.dtype), S


def ssd_chunked(x, dt, A, B, C, D=None, initial_state=None, chunk_size=64):
    """Chunk-parallel form (the fast CPU prefill): within a chunk of L tokens the scan
    is a masked product, y_t = sum_{s<=t} (C_t.B_s) exp(a_t - a_s) dt_s x_s with a the
    cumulative dt*A; the state enters each chunk decayed by exp(a_t) and leaves it
    as S exp(a_L) + sum_s exp(a_L - a_s) dt_s x_s B_s^T. Same results as
    ssd_recurrent up to fp32 rounding."""
    T, H, P, G, N = check(x, dt, A, B, C, D)
    S = start_state(initial_state, H, P, N, x.device)
    L = chunk_size
    pad = (L - T % L) % L
    n = (T + pad) // L
    # [H, n, L, *] fp32; padding has dt = 0: no decay and no input, so no effect
    xf = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, pad)).permute(1, 0, 2)
    dtf = torch.nn.functional.pad(dt.float(), (0, 0, 0, pad)).t()
    Bh = torch.nn.functional.pad(_per_head(B, H), (0, 0, 0, 0, 0, pad)).permute(1, 0, 2)
    Ch = torch.nn.functional.pad(_per_head(C, H), (0, 0, 0, 0, 0, pad)).permute(1, 0, 2)
    xf, Bh, Ch = (t.reshape(H, n, L, -1) for t in (xf, Bh, Ch))
    dtf = dtf.reshape(H, n, L)
    a = (dtf * A.float()[:, None, None]).cumsum(-1)                  # [H, n, L]
    causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
    decay = (a[..., :, None] - a[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    xdt = xf * dtf[..., None]                                          # [H, n, L, P]
    y = ((Ch @ Bh.transpose(-1, -2)) * decay) @ xdt                    # within each chunk
    last = a[..., -1:]                                                 # [H, n, 1]
    into = xdt * (last - a).exp()[..., None]                           # what reaches the end
    for i in range(n):
        y[:, i] += a[:, i].exp()[..., None] * (Ch[:, i] @ S.transpose(-1, -2))
        S = S * last[:, i].exp()[..., None] + into[:, i].transpose(-1, -2) @ Bh[:, i]
    y = y.reshape(H, n * L, P)[:, :T].transpose(0, 1)
    if D is not None:
        y = y + D.float()[None, :, None] * x.float()
    return y.to(x.dtype), S

"""Gated delta rule (Gated DeltaNet), plain torch. All math in fp32.

Per step t, with state S [K, V] per head:
    S   = S * exp(g_t)
    u_t = (v_t - k_t^T S) * beta_t
    S   = S + k_t u_t^T
    o_t = scale * q_t^T S
q and k are expected already L2-normalized (the model does it).
"""

from __future__ import annotations

import torch


def recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=None, scale=None):
    """Step-by-step reference.

    q, k [T, H, K]; v [T, H, V]; g [T, H] log decay (<= 0); beta [T, H];
    initial_state [H, K, V] fp32 or None (zeros). Returns o [T, H, V] in v's dtype
    and the final state [H, K, V] fp32.
    """
    T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    out_dtype = v.dtype
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    S = torch.zeros(H, K, V, dtype=torch.float32, device=q.device) if initial_state is None \
        else initial_state.float().clone()
    o = torch.empty(T, H, V, dtype=torch.float32, device=q.device)
    for t in range(T):
        S = S * g[t].exp()[:, None, None]
        kv_mem = torch.einsum("hk,hkv->hv", k[t], S)
        u = (v[t] - kv_mem) * beta[t][:, None]
        S = S + k[t][:, :, None] * u[:, None, :]
        o[t] = torch.einsum("hk,hkv->hv", q[t] * scale, S)
    return o.to(out_dtype), S


def chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None, scale=None, chunk_size=64):
    """Chunk-parallel form (UT transform inside each chunk, a scan across chunks).

    Same arguments and results as `recurrent_gated_delta_rule`; the fast CPU prefill path.
    """
    T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    scale = K ** -0.5 if scale is None else scale
    out_dtype = v.dtype
    # [H, T, *] fp32, padded to a multiple of C (padding has g = 0, beta = 0: no effect)
    q, k, v = (x.float().transpose(0, 1) for x in (q, k, v))
    g, beta = (x.float().transpose(0, 1) for x in (g, beta))
    pad = (C - T % C) % C
    if pad:
        q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (torch.nn.functional.pad(x, (0, pad)) for x in (g, beta))
    n = (T + pad) // C
    q = q.reshape(H, n, C, K) * scale
    k = k.reshape(H, n, C, K)
    v = v.reshape(H, n, C, V)
    beta = beta.reshape(H, n, C)
    gc = g.reshape(H, n, C).cumsum(-1)                     # log decay from chunk start to t
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    # decay between positions j <= i inside a chunk: exp(gc_i - gc_j)
    diff = (gc[..., :, None] - gc[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    kb = k * beta[..., None]
    # (I + A) w = rhs with A strictly lower: A_ij = beta_i k_i.k_j decay_ij
    A = ((kb @ k.transpose(-1, -2)) * diff).tril(-1)
    # The solve runs in fp64: (I + A) can be ill-conditioned when keys in a chunk are
    # nearly parallel, and fp32 there costs ~1e-4 in logits against the recurrence.
    lower = torch.eye(C, dtype=torch.float64, device=q.device) + A.double()
    solve = lambda rhs: torch.linalg.solve_triangular(  # noqa: E731
        lower, rhs.double(), upper=False, unitriangular=True).float()
    u = solve(v * beta[..., None])                          # values corrected within the chunk
    w = solve(kb * gc.exp()[..., None])                     # keys that read the incoming state
    attn = (q @ k.transpose(-1, -2)) * diff                 # intra-chunk q.k with decay
    S = torch.zeros(H, K, V, dtype=torch.float32, device=q.device) if initial_state is None \
        else initial_state.float().clone()
    o = torch.empty(H, n, C, V, dtype=torch.float32, device=q.device)
    q_dec = q * gc.exp()[..., None]
    k_dec = k * (gc[..., -1:] - gc).exp()[..., None]
    for i in range(n):
        v_new = u[:, i] - w[:, i] @ S
        o[:, i] = q_dec[:, i] @ S + attn[:, i] @ v_new
        S = S * gc[:, i, -1].exp()[:, None, None] + k_dec[:, i].transpose(-1, -2) @ v_new
    o = o.reshape(H, n * C, V)[:, :T].transpose(0, 1)
    return o.to(out_dtype), S


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, in fp32."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)

"""Rotary position embedding (rotate-half / NeoX layout), partial or full."""

from __future__ import annotations

import torch


def rotary_cos_sin(positions, rotary_dim, base, dtype=torch.float32):
    """cos, sin [T, rotary_dim] for int positions [T]; each frequency appears twice
    (first half and second half), matching rotate-half."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32,
                                            device=positions.device) / rotary_dim))
    freqs = positions.float()[:, None] * inv_freq[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x, cos, sin):
    """x [T, H, D]; cos, sin [T, R] with R <= D even. Rotates the first R dims of each
    head (pairs i and i + R/2), passes the rest through. Returns x's shape and dtype."""
    R = cos.shape[-1]
    rot, rest = x[..., :R], x[..., R:]
    c, s = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    half = R // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    if R == x.shape[-1]:
        return rot * c + rotated * s
    return torch.cat([rot * c + rotated * s, rest], dim=-1)

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


def mrope_cos_sin(positions, rotary_dim, base, sections, dtype=torch.float32):
    """cos, sin [T, rotary_dim] for M-RoPE positions [3, T] (temporal, height, width),
    interleaved as Qwen3-VL and Qwen3.5 lay them out: rotary pair i turns with the
    height position when i % 3 == 1 and i < 3 * sections[1], with the width when
    i % 3 == 2 and i < 3 * sections[2], with the temporal one otherwise. With the three
    positions equal this is rotary_cos_sin."""
    half = rotary_dim // 2
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32,
                                            device=positions.device) / rotary_dim))
    i = torch.arange(half, device=positions.device)
    axis = torch.zeros(half, dtype=torch.long, device=positions.device)
    for a in (1, 2):
        n = sections[a] if len(sections) > a else 0
        axis[(i % 3 == a) & (i < 3 * n)] = a
    freqs = positions.float()[axis].T * inv_freq[None]       # [T, half]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)

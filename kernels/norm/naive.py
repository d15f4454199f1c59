"""RMSNorm variants, plain torch; statistics in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x, weight, eps, offset=0.0):
    """x [..., D]; weight [D]. Returns x / rms(x) * (weight + offset) in x's dtype.

    offset=1.0 is Qwen3.5's zero-centred norm (weights stored as w - 1); there the
    product is taken in fp32 before the cast, as transformers does.
    """
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (h * (weight.float() + offset)).to(x.dtype)
    return weight * h.to(x.dtype)


def gated_rms_norm(x, z, weight, eps):
    """Qwen3.5's gated norm: (weight * norm(x)) * silu(z); x, z [..., D]; weight [D]."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = weight * h.to(x.dtype)
    return (h * F.silu(z.float())).to(x.dtype)

"""SwiGLU activation, plain torch."""

from __future__ import annotations

import torch.nn.functional as F


def silu_and_mul(gate, up):
    """silu(gate) * up, same shape and dtype."""
    return F.silu(gate) * up

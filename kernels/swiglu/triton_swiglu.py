"""SwiGLU activation in Triton: silu(gate) * up, elementwise over flat blocks.

silu(gate) is rounded to gate's dtype before the product, as F.silu(gate) * up does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels import launch


@triton.jit
def _silu_mul_kernel(gate, up, y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(gate + offs, mask=m, other=0.).to(tl.float32)
    u = tl.load(up + offs, mask=m, other=0.).to(tl.float32)
    s = (g / (1. + tl.exp(-g))).to(gate.dtype.element_ty).to(tl.float32)
    tl.store(y + offs, (s * u).to(y.dtype.element_ty), mask=m)


def silu_and_mul(gate, up):
    """gate, up [...] of one shape. Returns silu(gate) * up in their promoted dtype."""
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have one shape, got {tuple(gate.shape)}, "
                         f"{tuple(up.shape)}")
    gate, up = gate.contiguous(), up.contiguous()
    y = torch.empty(gate.shape, dtype=torch.promote_types(gate.dtype, up.dtype),
                    device=gate.device)
    n = gate.numel()
    if n:
        p = launch.swiglu(launch.target(gate.device))
        _silu_mul_kernel[(triton.cdiv(n, p["BLOCK"]),)](gate, up, y, n, **p.kwargs())
    return y

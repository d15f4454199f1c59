"""The kernel entry points the model calls.

Each name is the plain-torch reference today; kernels/dispatch.py routes to
Triton where a Triton version exists and the tensors are on CUDA.
"""

from __future__ import annotations

from kernels.conv1d.naive import causal_conv1d, causal_conv1d_update
from kernels.gated_delta.naive import chunk_gated_delta_rule, l2norm, recurrent_gated_delta_rule
from kernels.norm.naive import gated_rms_norm, rms_norm
from kernels.paged_attention.naive import (
    gather_pages,
    paged_attention,
    paged_decode_attention,
    scatter_pages,
    write_kv,
)
from kernels.rotary.naive import apply_rotary, rotary_cos_sin
from kernels.swiglu.naive import silu_and_mul

__all__ = [
    "apply_rotary", "causal_conv1d", "causal_conv1d_update", "chunk_gated_delta_rule",
    "gated_rms_norm", "gather_pages", "l2norm", "paged_attention", "paged_decode_attention",
    "recurrent_gated_delta_rule", "rms_norm", "rotary_cos_sin", "scatter_pages", "silu_and_mul",
    "write_kv",
]

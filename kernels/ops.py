"""The kernel entry points the model calls.

Each name routes per call (kernels/dispatch.py): the Triton kernel when its
tensors are on CUDA, or when CKPTD_KERNELS=triton; the plain-torch reference in
kernels/<op>/naive.py otherwise, or when CKPTD_KERNELS=torch. The *_varlen,
*_cells and decode forms take packed sequences and update state pools in place.
"""

from __future__ import annotations

from ckptd.kernels.dispatch import (
    apply_rotary,
    causal_conv1d,
    causal_conv1d_update,
    causal_conv1d_update_cells,
    causal_conv1d_varlen,
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_varlen,
    gated_delta_decode,
    gated_rms_norm,
    gather_pages,
    gather_states,
    l2norm,
    moe_experts,
    moe_experts_clamped,
    mrope_cos_sin,
    paged_attention,
    paged_attention_varlen,
    paged_decode_attention,
    quant_embedding,
    quant_matmul,
    quant_moe_experts,
    recurrent_gated_delta_rule,
    recurrent_gated_delta_rule_varlen,
    rms_norm,
    rotary_cos_sin,
    scatter_pages,
    scatter_states,
    selective_scan_varlen,
    silu_and_mul,
    ssd_varlen,
    step_attention,
    step_conv1d,
    step_gated_delta,
    step_mamba1,
    step_mamba2,
    use_triton,
    write_kv,
)

__all__ = [
    "apply_rotary", "causal_conv1d", "causal_conv1d_update", "causal_conv1d_update_cells",
    "causal_conv1d_varlen", "chunk_gated_delta_rule", "chunk_gated_delta_rule_varlen",
    "gated_delta_decode", "gated_rms_norm", "gather_pages", "gather_states", "l2norm",
    "moe_experts", "moe_experts_clamped", "mrope_cos_sin", "paged_attention",
    "paged_attention_varlen",
    "paged_decode_attention", "quant_embedding", "quant_matmul", "quant_moe_experts",
    "recurrent_gated_delta_rule", "recurrent_gated_delta_rule_varlen", "rms_norm",
    "rotary_cos_sin", "scatter_pages", "scatter_states", "selective_scan_varlen", "silu_and_mul",
    "ssd_varlen", "step_attention", "step_conv1d", "step_gated_delta", "step_mamba1",
    "step_mamba2", "use_triton",
    "write_kv",
]

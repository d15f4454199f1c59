"""The linears a LoRA adapter may target, by the fused matmul that computes each: what
an adapter is checked against (adapter.py) and what a loaded one wraps (apply.py)."""

from __future__ import annotations

# module class name -> [(fused matmul attribute, the linears it computes side by side)]
FUSED = {
    "Attention": [("qkv", ("q_proj", "k_proj", "v_proj")), ("out", ("o_proj",))],
    "MLP": [("gate_up", ("gate_proj", "up_proj")), ("down", ("down_proj",))],
    "GatedDeltaNet": [("in_proj", ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")),
                      ("out", ("out_proj",))],
}


def adaptable(model) -> set[str]:
    """Names of the linears a LoRA may adapt in this model."""
    out = {"lm_head"}
    for name, mod in model.named_modules():
        for _, linears in FUSED.get(type(mod).__name__, ()):
            out.update(f"{name}.{lin}" for lin in linears)
    return out

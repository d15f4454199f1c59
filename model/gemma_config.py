"""The configuration of Gemma 3's text model (`gemma3_text`, Gemma3ForCausalLM), from its
config.json.

A `GemmaConfig` is a `ModelConfig` whose layers are all attention, of two kinds:

    sliding_attention  a query sees the `sliding_window` keys up to its own position
                       (transformers' `kv_idx > q_idx - sliding_window`), rotary base
                       `rope_local_theta`
    full_attention     every earlier key, rotary base `rope_theta` (Gemma 3's 4B and up
                       scale its positions linearly: `rope_factor`)

Both kinds keep their KV pages like full layers (the cache restores any prefix exactly);
the window only masks what a query sees. The rest of Gemma 3 is read here too: the
attention scale `query_pre_attn_scalar ** -0.5`, the GELU (tanh) MLP, and the final
logits' soft cap `cap * tanh(logits / cap)`. Attention logit soft-capping (Gemma 2) and
bidirectional attention (EmbeddingGemma) are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptd.model.config import GEMMA_ARCHS, ModelConfig, hf_fields
from ckptd.model.window_config import WindowedAttention, config_of


@dataclass(frozen=True)
class GemmaConfig(WindowedAttention, ModelConfig):
    sliding_window: int = 0
    rope_local_theta: float = 10000.0
    rope_factor: float = 1.0                 # full layers' linear position scaling
    query_pre_attn_scalar: float = 0.0
    final_logit_softcapping: float = 0.0     # 0: none

    def __post_init__(self) -> None:
        if self.arch not in GEMMA_ARCHS:
            raise ValueError(f"config: {self.arch!r} is not a Gemma 3 text model")
        if not self.mlp_types:
            object.__setattr__(self, "mlp_types", ("dense",) * self.num_layers)
        self.check_attention(("intermediate_size", "query_pre_attn_scalar"))
        if self.rope_factor <= 0:
            raise ValueError(f"config: the rope scaling factor must be positive, "
                             f"got {self.rope_factor}")

    @classmethod
    def from_hf(cls, d: dict) -> GemmaConfig:
        """From a gemma3_text config.json dict: transformers 5's `rope_parameters` per
        layer kind, or the Hub's older `rope_theta`, `rope_local_base_freq`,
        `rope_scaling` and `sliding_window_pattern`. ValueError naming a missing,
        mistyped or unsupported key."""
        return config_of(cls, d, _fields)


def _fields(d: dict) -> dict:
    for name in ("attn_logit_softcapping", "use_bidirectional_attention"):
        if d.get(name):
            raise ValueError(f"config: {name} is not supported (Gemma 3 text models have "
                             f"none), got {d[name]!r}")
    if d.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ValueError(f"config: unsupported hidden_activation {d['hidden_activation']!r}")
    base = hf_fields(d, eps=1e-6, tie=True, bias=False, max_pos=131072)
    types = d.get("layer_types")
    if types is None:
        every = int(d.get("sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % every else "full_attention"
                 for i in range(base["num_layers"])]
    rope = d.get("rope_parameters") or {}
    full = dict(rope.get("full_attention") or {})
    local = dict(rope.get("sliding_attention") or {})
    full.update(d.get("rope_scaling") or {})
    kind = full.get("rope_type", full.get("type", "default"))
    if kind not in ("default", "linear"):
        raise ValueError(f"config: unsupported rope type {kind!r} (default and linear are)")
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"config: unsupported local rope type {local['rope_type']!r}")
    cap = d.get("final_logit_softcapping")
    return dict(
        **base,
        intermediate_size=int(d["intermediate_size"]),
        layer_types=tuple(types),
        rope_theta=float(full.get("rope_theta", d.get("rope_theta", 1_000_000.0))),
        rope_local_theta=float(local.get("rope_theta", d.get("rope_local_base_freq", 10000.0))),
        rope_factor=float(full.get("factor", 1.0)) if kind == "linear" else 1.0,
        sliding_window=int(d.get("sliding_window") or 0),
        query_pre_attn_scalar=float(d.get("query_pre_attn_scalar") or base["head_dim"]),
        final_logit_softcapping=float(cap) if cap else 0.0,
    )

"""The configuration of gpt-oss (`gpt_oss`, GptOssForCausalLM), from its config.json.

A `GptOssConfig` is a `ModelConfig` whose layers are attention, alternating

    sliding_attention  a query sees the `sliding_window` (128) keys up to its own position
    full_attention     every earlier key

each with attention sinks (a learned logit per query head in the softmax denominator)
and biases on q, k, v and o; and every MLP a mixture of experts: a biased router whose
top-k logits are softmaxed among themselves, experts with biases and the clamped SwiGLU
`(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)`, g = min(gate, limit). Window
layers keep their KV pages like full ones (the cache restores any prefix exactly). The
rotary is YaRN as transformers computes it (`yarn_inv_freq`), or plain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ckptd.model.config import GPT_OSS_ARCHS, ModelConfig, hf_fields
from ckptd.model.window_config import WindowedAttention, config_of


@dataclass(frozen=True)
class GptOssConfig(WindowedAttention, ModelConfig):
    sliding_window: int = 0
    rope_type: str = "default"               # or "yarn"
    rope_factor: float = 1.0
    rope_original_max: int = 4096            # YaRN's original_max_position_embeddings
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_truncate: bool = True
    rope_attention_factor: float = 0.0       # 0: from the factor, as transformers infers it
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def __post_init__(self) -> None:
        if self.arch not in GPT_OSS_ARCHS:
            raise ValueError(f"config: {self.arch!r} is not gpt-oss")
        object.__setattr__(self, "mlp_types", ("moe",) * self.num_layers)
        self.check_attention(("num_experts", "num_experts_per_tok", "moe_intermediate_size"))
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"config: num_experts_per_tok {self.num_experts_per_tok} exceeds "
                             f"num_local_experts {self.num_experts}")
        if self.rope_type not in ("default", "yarn"):
            raise ValueError(f"config: unsupported rope type {self.rope_type!r} "
                             "(default and yarn are)")
        if self.rope_factor <= 0 or self.rope_original_max <= 0:
            raise ValueError("config: the rope scaling factor and original_max_position_"
                             "embeddings must be positive")
        if self.swiglu_limit <= 0:
            raise ValueError(f"config: swiglu_limit must be positive, got {self.swiglu_limit}")

    def rotary(self) -> tuple[torch.Tensor, float]:
        """(inverse frequencies [head_dim / 2] fp32, the factor cos and sin are scaled by)."""
        dim, base = self.head_dim, self.rope_theta
        inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim)
        if self.rope_type == "default":
            return inv_freq, 1.0
        return yarn_inv_freq(inv_freq, dim, base, self.rope_factor, self.rope_original_max,
                             self.rope_beta_fast, self.rope_beta_slow, self.rope_truncate,
                             self.rope_attention_factor)

    @classmethod
    def from_hf(cls, d: dict) -> GptOssConfig:
        """From a gpt_oss config.json dict (transformers 5's `rope_parameters` or the Hub's
        `rope_scaling` and `rope_theta`). ValueError naming a missing, mistyped or
        unsupported key."""
        return config_of(cls, d, _fields)


def yarn_inv_freq(inv_freq: torch.Tensor, dim: int, base: float, factor: float,
                  original_max: int, beta_fast: float, beta_slow: float, truncate: bool,
                  attention_factor: float = 0.0) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071) as transformers' _compute_yarn_parameters: the frequencies
    that turn fewer than beta_slow times over the original context are interpolated
    (divided by factor), those that turn more than beta_fast times kept, a linear ramp
    between; cos and sin scaled by 0.1 ln(factor) + 1 unless attention_factor says."""
    def turns_at(rotations: float) -> float:      # the dimension turning that often
        return dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = turns_at(beta_fast), turns_at(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pair = torch.arange(dim // 2, dtype=torch.float32, device="cpu")
    ramp = ((pair - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp                                # 1: extrapolated (kept) frequency
    out = inv_freq / factor * (1 - keep) + inv_freq * keep
    if not attention_factor:
        attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return out, float(attention_factor)


def _fields(d: dict) -> dict:
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config: unsupported hidden_act {act!r} (gpt-oss' experts are "
                         "the clamped SwiGLU)")
    rope = dict(d.get("rope_parameters") or {})
    rope.update(d.get("rope_scaling") or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "yarn"):
        raise ValueError(f"config: unsupported rope type {kind!r} (default and yarn are)")
    if kind == "yarn" and (rope.get("mscale") or rope.get("mscale_all_dim")):
        raise ValueError("config: YaRN's mscale / mscale_all_dim are not supported")
    base = hf_fields(d, eps=1e-5, tie=False, bias=True, max_pos=131072)
    types = d.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                     for i in range(base["num_layers"])]
    factor = rope.get("factor")
    original = int(rope.get("original_max_position_embeddings") or 4096)
    return dict(
        **base,
        intermediate_size=int(d["intermediate_size"]),
        layer_types=tuple(types),
        rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 150000.0))),
        rope_type=kind,
        rope_factor=float(factor if factor is not None else
                          (base["max_position_embeddings"] / original if kind == "yarn"
                           else 1.0)),
        rope_original_max=original,
        rope_beta_fast=float(rope.get("beta_fast") or 32.0),
        rope_beta_slow=float(rope.get("beta_slow") or 1.0),
        rope_truncate=bool(rope.get("truncate", True)),
        rope_attention_factor=float(rope.get("attention_factor") or 0.0),
        num_experts=int(d["num_local_experts"]),
        num_experts_per_tok=int(d["num_experts_per_tok"]),
        moe_intermediate_size=int(d["intermediate_size"]),
        sliding_window=int(d.get("sliding_window") or 0),
        swiglu_alpha=float(d.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(d.get("swiglu_limit", 7.0)),
    )

"""The configuration of the selective state space hybrids, from their config.json:
Nemotron-H (`nemotron_h`), Granite-4.0-H (`granitemoehybrid`), Falcon-H1
(`falcon_h1`), the pure `mamba2`, and Jamba (`jamba`, Mamba v1).

An `SSMConfig` is a `ModelConfig` (the loader, the runner and the fingerprint read it
alike) whose layers are described by two lists:

    layer_types  the sequence mixer: "mamba2", "mamba" (v1), "full_attention",
                 "parallel" (attention and mamba2 side by side, Falcon-H1) or "none"
    mlp_types    "dense", "moe" or "none" (Nemotron-H puts mixers and MLPs in
                 layers of their own)

A layer runs norm -> mixer -> residual, then norm -> MLP -> residual, skipping a part
that is "none" (model/arch/ssm_lm.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ckptd.model.config import SSM_ARCHS, LayerKinds, ModelConfig, check_dtype
from ckptd.model.spec import AttentionSpec, RecurrentSpec, StateSpec
from ckptd.model.ssm_families import FAMILIES

MIXERS = ("mamba2", "mamba", "full_attention", "parallel", "none")
MLPS = ("dense", "moe", "none")


@dataclass(frozen=True)
class SSMConfig(LayerKinds, ModelConfig):
    ATTENTION = ("full_attention", "parallel")
    RECURRENT = ("mamba2", "mamba", "parallel")

    # the selective state space layers: Mamba2 heads of ssm_head_dim, or for Mamba (v1)
    # ssm_inner channels (ssm_heads 1, ssm_head_dim the channels)
    ssm_heads: int = 0
    ssm_head_dim: int = 0
    ssm_state_size: int = 0
    ssm_groups: int = 1
    ssm_conv_kernel: int = 4
    ssm_dt_rank: int = 0                     # Mamba (v1): the time step's low rank
    ssm_conv_bias: bool = True
    ssm_in_bias: bool = False
    ssm_out_bias: bool = False
    ssm_norm: bool = True                    # the gated group RMSNorm before out_proj
    ssm_norm_before_gate: bool = False       # Falcon-H1 may normalise, then gate
    ssm_eps: float = 1e-5
    ssm_dt_limit: tuple[float, float] = (0.0, math.inf)
    mlp_act: str = "silu"                    # "silu" (gated) or "relu2" (Nemotron-H)
    mlp_bias: bool = False
    shared_mlp_size: int = 0                 # Granite's always-on MLP beside the experts
    # scales applied at run time
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_multiplier: float = 1.0
    attention_scale: float = 0.0             # 0: head_dim ** -0.5
    # Falcon-H1's scales, folded into their weights at load (model/ssm_checkpoint.py),
    # as llama.cpp's converter folds them into the GGUF
    attention_in_multiplier: float = 1.0
    attention_out_multiplier: float = 1.0
    key_multiplier: float = 1.0
    ssm_in_multiplier: float = 1.0
    ssm_out_multiplier: float = 1.0
    ssm_multipliers: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0)
    mlp_multipliers: tuple[float, float] = (1.0, 1.0)

    def __post_init__(self) -> None:
        if self.arch not in SSM_ARCHS:
            raise ValueError(f"config: {self.arch!r} is not a state space hybrid")
        n = self.num_layers
        if n <= 0 or len(self.layer_types) != n or len(self.mlp_types) != n:
            raise ValueError(f"config: {n} layers need {n} mixer and {n} MLP kinds, got "
                             f"{len(self.layer_types)} and {len(self.mlp_types)}")
        for kinds, allowed in ((self.layer_types, MIXERS), (self.mlp_types, MLPS)):
            bad = set(kinds) - set(allowed)
            if bad:
                raise ValueError(f"config: unknown layer kind(s) {sorted(bad)}")
        for name in ("vocab_size", "hidden_size"):
            _positive(self, name)
        if self.n_attention:
            for name in ("num_heads", "num_kv_heads", "head_dim"):
                _positive(self, name)
            if self.num_heads % self.num_kv_heads:
                raise ValueError(f"config: num_attention_heads {self.num_heads} is not a "
                                 f"multiple of num_key_value_heads {self.num_kv_heads}")
            if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
                raise ValueError(f"config: rotary dim {self.rotary_dim} must be even and "
                                 "<= head_dim")
        if self.n_recurrent:
            for name in ("ssm_heads", "ssm_head_dim", "ssm_state_size", "ssm_groups",
                         "ssm_conv_kernel"):
                _positive(self, name)
            if self.ssm_heads % self.ssm_groups:
                raise ValueError(f"config: {self.ssm_groups} SSM groups do not divide "
                                 f"{self.ssm_heads} heads")
            if "mamba" in self.layer_types:
                _positive(self, "ssm_dt_rank")
        if "dense" in self.mlp_types:
            _positive(self, "intermediate_size")
        if "moe" in self.mlp_types:
            for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
                _positive(self, name)
            if self.num_experts_per_tok > self.num_experts:
                raise ValueError(f"config: num_experts_per_tok {self.num_experts_per_tok} "
                                 f"exceeds num_experts {self.num_experts}")
        if self.mlp_act not in ("silu", "relu2"):
            raise ValueError(f"config: unsupported MLP activation {self.mlp_act!r}")
        check_dtype(self.dtype)

    @property
    def ssm_inner(self) -> int:
        return self.ssm_heads * self.ssm_head_dim

    @property
    def ssm_conv_dim(self) -> int:
        """Channels of the causal conv: x, B and C for Mamba2; x for Mamba (v1)."""
        if "mamba" in self.layer_types:
            return self.ssm_inner
        return self.ssm_inner + 2 * self.ssm_groups * self.ssm_state_size

    def state_spec(self, block_size: int, dtype: torch.dtype = torch.float32) -> StateSpec:
        attn = AttentionSpec(self.n_attention, self.num_kv_heads, self.head_dim, dtype) \
            if self.n_attention else None
        rec = RecurrentSpec.ssm(self.n_recurrent, self.ssm_conv_dim, self.ssm_conv_kernel,
                                self.ssm_heads, self.ssm_head_dim, self.ssm_state_size,
                                conv_dtype=dtype) if self.n_recurrent else None
        return StateSpec(block_size, attn, rec)

    @classmethod
    def from_hf(cls, d: dict) -> SSMConfig:
        """From a config.json dict of one of SSM_ARCHS (or what the GGUF loader makes of
        a GGUF's metadata); ValueError naming a missing or mistyped key."""
        try:
            fields = FAMILIES[d["model_type"]](d)
        except KeyError as e:
            raise ValueError(f"config.json is missing {e.args[0]!r}") from None
        except TypeError as e:                # int(None), int([...]), ...
            raise ValueError(f"config.json has a value of the wrong type: {e}") from None
        return cls(**fields, raw=dict(d))


def _positive(cfg: SSMConfig, name: str) -> None:
    if getattr(cfg, name) <= 0:
        raise ValueError(f"config: {name} must be positive, got {getattr(cfg, name)}")

"""Random-weight models with the layer shapes of real ones, built on the device (no
checkpoint is read or written): for engine benchmarks at sizes no test model has.

`a3b` is shaped after Qwen3.5-35B-A3B: hidden 2048; every fourth layer gated full
attention (16 query heads, 2 KV heads, head dim 256, a quarter of it rotated), the
others Gated DeltaNet (16 key heads and 32 value heads of 128, conv 4); every MLP a
mixture of 256 experts of 512, 8 routed per token plus a shared expert of 512; a
vocabulary of 248,320. The real model has 40 layers (~35B parameters, 70 GB in bf16):
`layers` keeps the first few, so the model fits one GPU beside a long context's KV.
"""

from __future__ import annotations

import hashlib
import json
import math

import torch

from ckptd.model.arch.decoder import CausalLM
from ckptd.model.config import ModelConfig
from ckptd.model.loader import build


def a3b_config(layers: int = 8) -> dict:
    if layers < 1:
        raise ValueError(f"--layers must be >= 1, got {layers}")
    return {
        "model_type": "qwen3_5_moe_text", "architectures": ["Qwen3_5MoeForCausalLM"],
        "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": layers,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                        for i in range(layers)],
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "norm_topk_prob": True,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "tie_word_embeddings": False,
        "attention_bias": False, "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0,
                            "partial_rotary_factor": 0.25},
    }


def random_model(hf_config: dict, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """A CausalLM of hf_config's shapes with random weights made on the device, through
    the loader's own assembly (fused projections, checks)."""

    cfg = ModelConfig.from_hf(hf_config)
    with torch.device("meta"):
        shapes = {n: tuple(t.shape) for n, t in CausalLM(cfg).state_dict().items()}
    gen = torch.Generator(device=device).manual_seed(seed)

    def make(name, shape):
        def recipe(dt, dev):
            if name.endswith("A_log"):        # decays exp(-exp(A_log) * dt) of 1..16
                return torch.empty(shape, device=dev).uniform_(0, math.log(16), generator=gen)
            if name.endswith("linear_attn.norm.weight"):              # a plain scale
                return torch.ones(shape, device=dev, dtype=dt)
            if name.endswith(("dt_bias", "norm.weight")):   # Qwen's other norms: 1 + w
                return torch.zeros(shape, device=dev, dtype=dt)
            fan_in = shape[-1]
            return (torch.randn(shape, device=dev, generator=gen) / math.sqrt(fan_in)).to(dt)
        return recipe

    model = build(cfg, {n: make(n, s) for n, s in shapes.items()}, dtype, device)
    ident = json.dumps([hf_config, seed, str(dtype)], sort_keys=True).encode()
    model.fingerprint = hashlib.blake2b(ident, digest_size=16).hexdigest()
    return model

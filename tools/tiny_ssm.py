"""Tiny random models written by transformers' own classes: the state space hybrids
(`ckptd make-tiny --arch nemotron_h | granitemoehybrid | falcon_h1 | mamba2 | jamba`)
and Gemma 3's text model (`--arch gemma3`: local layers of a 16-token window, a global
one, soft-capped logits, linearly scaled global rotary), and gpt-oss (`--arch gpt_oss`:
window layers of 16 tokens alternating with full ones, sinks, 8 experts of which 2 a
token, YaRN).

Each is built by its transformers class with seeded weights of a useful scale (the
classes' init makes near-uniform logits), saved with save_pretrained (the Hub's
tensor layout: Granite's input_linear, Jamba's one tensor per expert, Nemotron-H's
backbone.*), and its config.json written as the released checkpoints write it:
Nemotron-H's `hybrid_override_pattern` and no MoE keys, Granite's "mamba" /
"attention" layer types. llama.cpp's converter reads those (transformers 5's names
make it write Granite without attention layers, and any Nemotron-H as its MoE
variant); transformers reads both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

ARCHES = ("nemotron_h", "granitemoehybrid", "falcon_h1", "mamba2", "jamba", "gemma3",
          "gpt_oss")

_BASE = dict(vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             tie_word_embeddings=False, bos_token_id=0, eos_token_id=2, pad_token_id=0,
             max_position_embeddings=262144)
_MAMBA2 = dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=2,
               mamba_chunk_size=16)
# model_type -> (config class, model class, config kwargs)
_MODELS = {
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM", dict(
        **_BASE, layers_block_type=["linear_attention", "mlp", "full_attention", "mlp",
                                  "linear_attention", "mlp"],
        head_dim=16, intermediate_size=96, mamba_num_heads=8, mamba_head_dim=16,
        ssm_state_size=16, n_groups=2, conv_kernel=4, chunk_size=16)),
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", dict(
        **_BASE, **_MAMBA2, num_hidden_layers=4,
        layer_types=["mamba", "mamba", "attention", "mamba"], intermediate_size=32,
        shared_intermediate_size=48, num_local_experts=8, num_experts_per_tok=2,
        embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2,
        logits_scaling=3.0, position_embedding_type="nope")),
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM", dict(
        **_BASE, **_MAMBA2, num_hidden_layers=3, head_dim=16, intermediate_size=96,
        mamba_d_ssm=128, mamba_rms_norm=True, mamba_norm_before_gate=False,
        attention_in_multiplier=0.7, attention_out_multiplier=0.9, ssm_in_multiplier=1.1,
        ssm_out_multiplier=0.8, key_multiplier=0.6, embedding_multiplier=1.5,
        lm_head_multiplier=0.5, mlp_multipliers=[0.9, 1.2],
        ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.05])),
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM", dict(
        vocab_size=512, hidden_size=64, num_hidden_layers=3, num_heads=8, head_dim=16,
        state_size=16, n_groups=2, expand=2, chunk_size=16, bos_token_id=0, eos_token_id=2,
        pad_token_id=0, tie_word_embeddings=False)),
    "jamba": ("JambaConfig", "JambaForCausalLM", dict(
        **_BASE, num_hidden_layers=4, intermediate_size=96, num_experts=4,
        num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1,
        attn_layer_period=4, attn_layer_offset=2, mamba_d_state=16, mamba_expand=2,
        mamba_dt_rank=8)),
    # 7 layers: local, local, local, local, local, global, local
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        **{**_BASE, "tie_word_embeddings": True}, num_hidden_layers=7, head_dim=16,
        intermediate_size=96, sliding_window=16, query_pre_attn_scalar=16,
        final_logit_softcapping=30.0, rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    # 4 layers: window, full, window, full; YaRN as the released config (factor 32 over
    # 4096 positions, truncate off), its tiny heads rotating through the ramp
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        **{**_BASE, "max_position_embeddings": 131072}, num_hidden_layers=4, head_dim=16,
        intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, sliding_window=16,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4096})),
}
# norms whose weight is stored as w - 1 (the 1 is added at run time)
_ZERO_CENTRED = {"gemma3": lambda name: "norm" in name}
# transformers 5's NemotronHConfig writes every MoE key; a dense checkpoint has none
_NEMOTRON_MOE_KEYS = ("moe_intermediate_size", "moe_latent_size", "n_routed_experts",
                      "moe_shared_expert_intermediate_size", "moe_shared_expert_overlap",
                      "mtp_layers_block_type", "n_group", "n_shared_experts", "norm_topk_prob",
                      "num_experts_per_tok", "num_nextn_predict_layers", "output_router_logits",
                      "routed_scaling_factor", "topk_group")
_PATTERN = {"linear_attention": "M", "full_attention": "*", "mlp": "-"}


def randomize(model, seed: int, zero_centred: Callable[[str], bool] = lambda name: False
              ) -> None:
    """Seeded weights of a useful scale for a transformers model (its own init makes
    near-uniform logits): decays in (0.05, 1), time-step biases in (-1, 1), norms near 1
    (near 0 where zero_centred(name): Qwen3.5 adds the 1 at run time)."""
    g = torch.Generator().manual_seed(seed)
    normal = lambda shape, scale, mean=0.0: mean + scale * torch.randn(shape, generator=g)  # noqa: E731
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = p.shape
            if name.endswith("A_log"):
                t = torch.log(torch.empty(shape).uniform_(0.05, 1.0, generator=g))
            elif name.endswith(("dt_bias", "dt_proj.bias")):
                t = torch.empty(shape).uniform_(-1.0, 1.0, generator=g)
            elif "norm" in name:
                t = normal(shape, 0.1, 0.0 if zero_centred(name) else 1.0)
            elif name.endswith(".D") or "embed_tokens" in name or "embeddings" in name:
                t = normal(shape, 1.0 if name.endswith(".D") else 0.2)
            elif name == "lm_head.weight" or name.endswith(".bias"):
                t = normal(shape, 0.1)
            else:   # a Conv3d patch embedding's fan-in is its whole kernel
                fan_in = shape[1:].numel() if p.dim() == 5 else shape[-1]
                t = normal(shape, 0.5 / fan_in ** 0.5)
            p.copy_(t)


def _hub_style(arch: str, cfg: dict) -> dict:
    """config.json as the released checkpoints write it (see the module docstring)."""
    if arch == "nemotron_h":
        kinds = cfg.pop("layers_block_type")
        cfg = {k: v for k, v in cfg.items() if k not in _NEMOTRON_MOE_KEYS}
        cfg["hybrid_override_pattern"] = "".join(_PATTERN[k] for k in kinds)
        cfg["num_hidden_layers"] = len(kinds)
    if arch == "granitemoehybrid":
        cfg["layer_types"] = ["mamba" if k == "linear_attention" else "attention"
                              for k in cfg["layer_types"]]
    return cfg


def build(arch: str, out: Path, seed: int = 0, eos_token_id: int = 2) -> Path:
    """Write the tiny `arch` model's config.json and model.safetensors to out/."""
    # transformers is a test extra, not a dependency of the daemon that imports make_tiny
    import transformers

    config_cls, model_cls, kwargs = _MODELS[arch]
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**{**kwargs, "eos_token_id": eos_token_id})
    model = getattr(transformers, model_cls)(config).eval()
    randomize(model, seed, _ZERO_CENTRED.get(arch, lambda name: False))
    model.save_pretrained(out)
    f = out / "config.json"
    f.write_text(json.dumps(_hub_style(arch, json.loads(f.read_text())), indent=1))
    return out

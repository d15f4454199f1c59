"""The state space hybrids' checkpoint names onto the model's (arch/ssm_lm.py), as
recipes (model/checkpoint.py) that run when the loader assigns each parameter.

    nemotron_h, mamba2   backbone.* / model.*: embeddings -> embed_tokens, norm_f -> norm;
                         layers.N.norm and layers.N.mixer.* go to the layer's one part
                         (input_layernorm + mamba / self_attn, or
                         post_attention_layernorm + mlp)
    granitemoehybrid     block_sparse_moe.{input_linear, output_linear, router.layer} ->
                         mlp.experts.{gate_up_proj, down_proj}, mlp.gate (transformers'
                         own names too); shared_mlp.input_linear [2S, H] -> shared_mlp
                         gate_proj (first S rows) and up_proj
    falcon_h1, jamba     feed_forward -> mlp (Jamba's router -> mlp.gate; its experts, one
                         tensor each, are stacked by checkpoint.adapt), pre_ff_layernorm ->
                         post_attention_layernorm, final_layernorm -> norm

Falcon-H1's multipliers of single weights are folded into them here, as llama.cpp's
converter folds them into the GGUF (whose config then says 1.0): attention_in into q, k,
v; key into k; attention_out into o_proj; ssm_in and the five ssm_multipliers (rows of z,
x, B, C, dt) into the mamba in_proj; ssm_out into its out_proj; mlp_multipliers into
gate_proj and down_proj. A bias is scaled by what scales the output, not the input.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from ckptd.model.checkpoint import Recipe, plain
from ckptd.model.ssm_config import SSMConfig

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.*)$")
_GRANITE = (("block_sparse_moe.input_linear.weight", "mlp.experts.gate_up_proj"),
            ("block_sparse_moe.output_linear.weight", "mlp.experts.down_proj"),
            ("block_sparse_moe.router.layer.weight", "mlp.gate.weight"),
            ("block_sparse_moe.experts.gate_up_proj", "mlp.experts.gate_up_proj"),
            ("block_sparse_moe.experts.down_proj", "mlp.experts.down_proj"),
            ("block_sparse_moe.router.weight", "mlp.gate.weight"),
            ("shared_mlp.output_linear.weight", "shared_mlp.down_proj.weight"))
_FEED_FORWARD = (("feed_forward.router.weight", "mlp.gate.weight"),
                 ("feed_forward.", "mlp."), ("pre_ff_layernorm.", "post_attention_layernorm."))


def rename(cfg: SSMConfig, recipes: dict[str, Recipe]) -> dict[str, Recipe]:
    """Recipes under the model's names (see the module docstring)."""
    out: dict[str, Recipe] = {}
    for name, r in recipes.items():
        if name.startswith("backbone."):
            name = "model." + name[len("backbone."):]
        name = {"model.embeddings.weight": "model.embed_tokens.weight",
                "model.norm_f.weight": "model.norm.weight",
                "model.final_layernorm.weight": "model.norm.weight"}.get(name, name)
        m = _LAYER.match(name)
        if m is None:
            out[name] = r
            continue
        i, rest = int(m.group(1)), m.group(2)
        if i >= cfg.num_layers:
            raise ValueError(f"checkpoint tensor {name!r} is past the model's "
                             f"{cfg.num_layers} layers")
        for new in _layer_names(cfg, i, rest, r):
            out[f"model.layers.{i}.{new[0]}"] = new[1]
    if cfg.arch == "falcon_h1":
        _fold_falcon(cfg, out)
    return out


def _layer_names(cfg: SSMConfig, i: int, rest: str, r: Recipe) -> list[tuple[str, Recipe]]:
    mixer, mlp = cfg.layer_types[i], cfg.mlp_types[i]
    if rest == "norm.weight":                     # Nemotron-H / Mamba2: the block's one norm
        return [("input_layernorm.weight" if mixer != "none" else
                 "post_attention_layernorm.weight", r)]
    if rest.startswith("mixer."):
        part = "mamba" if mixer in ("mamba2", "mamba") else \
            "self_attn" if mixer == "full_attention" else "mlp" if mlp != "none" else "mixer"
        return [(f"{part}.{rest[len('mixer.'):]}", r)]
    if rest == "shared_mlp.input_linear.weight":  # Granite: [gate; up] rows
        S = cfg.shared_mlp_size
        return [("shared_mlp.gate_proj.weight", _rows(r, 0, S)),
                ("shared_mlp.up_proj.weight", _rows(r, S, 2 * S))]
    for old, new in _GRANITE + _FEED_FORWARD:
        if rest.startswith(old):
            return [(new + rest[len(old):], r)]
    return [(rest, r)]


def _rows(r: Recipe, a: int, b: int) -> Recipe:
    if isinstance(r, plain):
        return plain(lambda: r.raw()[a:b])
    return lambda dtype, device: r(dtype, device)[a:b]


def _scaled(r: Recipe, scale: Callable[[torch.Tensor], torch.Tensor]) -> Recipe:
    def run(dtype, device):
        t = r(dtype, device)
        return scale(t).to(dtype)
    return run


def _fold_falcon(cfg: SSMConfig, out: dict[str, Recipe]) -> None:
    a_in, key, a_out = (cfg.attention_in_multiplier, cfg.key_multiplier,
                        cfg.attention_out_multiplier)
    gate_m, down_m = cfg.mlp_multipliers
    inner, gn, H = cfg.ssm_inner, cfg.ssm_groups * cfg.ssm_state_size, cfg.ssm_heads
    # in_proj's output rows: z, x, B, C, dt (the x, B, C rows are the conv's channels)
    mup = torch.cat([torch.full((n,), float(m)) for n, m in
                     zip((inner, inner, gn, gn, H), cfg.ssm_multipliers)])
    # (name ending, weight scale, bias scale)
    table = (("self_attn.q_proj", a_in, 1.0), ("self_attn.k_proj", a_in * key, key),
             ("self_attn.v_proj", a_in, 1.0), ("self_attn.o_proj", a_out, a_out),
             ("mamba.out_proj", cfg.ssm_out_multiplier, cfg.ssm_out_multiplier),
             ("mlp.gate_proj", gate_m, gate_m), ("mlp.down_proj", down_m, down_m))
    for name in list(out):
        stem, _, kind = name.rpartition(".")
        for part, w_scale, b_scale in table:
            s = w_scale if kind == "weight" else b_scale
            if stem.endswith(part) and s != 1.0:
                out[name] = _scaled(out[name], lambda t, s=s: t * s)
        if stem.endswith("mamba.in_proj") and (cfg.ssm_in_multiplier != 1.0 or
                                               bool((mup != 1.0).any())):
            s_in = cfg.ssm_in_multiplier if kind == "weight" else 1.0
            out[name] = _scaled(out[name], lambda t, s_in=s_in: t * (
                mup.to(t.device, torch.float32) * s_in).view(-1, *[1] * (t.dim() - 1)))

"""config.json of each state space hybrid -> SSMConfig's fields (model/ssm_config.py).

Each family names its keys its own way; these read the names transformers' config
classes use and the older ones the released checkpoints carry (Nemotron-H's
`hybrid_override_pattern`, Granite's "mamba" / "attention" layer types).
"""

from __future__ import annotations

import math


def _common(d: dict, n_layers: int) -> dict:
    eos = d.get("eos_token_id")
    heads = int(d.get("num_attention_heads") or 0)
    hidden = int(d["hidden_size"])
    rope = d.get("rope_parameters") or {}
    dtype = str(d.get("dtype") or d.get("torch_dtype") or "float32")
    return {
        "arch": d["model_type"],
        "vocab_size": int(d["vocab_size"]),
        "hidden_size": hidden,
        "intermediate_size": int(d.get("intermediate_size") or 0),
        "num_layers": n_layers,
        "num_heads": heads,
        "num_kv_heads": int(d.get("num_key_value_heads") or heads),
        "head_dim": int(d.get("head_dim") or d.get("attention_head_dim")
                        or (hidden // heads if heads else 0)),
        "rope_theta": float(rope.get("rope_theta", d.get("rope_theta", 10000.0))),
        "tie_word_embeddings": bool(d.get("tie_word_embeddings", False)),
        "attention_bias": bool(d.get("attention_bias", False)),
        "max_position_embeddings": int(d.get("max_position_embeddings") or 1 << 20),
        "bos_token_id": d.get("bos_token_id"),
        "eos_token_ids": tuple(eos) if isinstance(eos, list) else
        (() if eos is None else (int(eos),)),
        "dtype": dtype if dtype in ("float32", "float16", "bfloat16") else "float32",
    }


def _float(v) -> float:
    """A number of config.json; transformers writes infinity as {"__float__": "Infinity"}."""
    return float(v["__float__"] if isinstance(v, dict) else v)


def _limit(d: dict) -> tuple[float, float]:
    lo, hi = d.get("time_step_limit") or (0.0, math.inf)
    return (_float(lo), _float(hi))


def _mamba2_layers(d: dict, heads: int, head_dim: int, state: int, groups: int,
                   conv: int, eps: float) -> dict:
    return {"ssm_heads": heads, "ssm_head_dim": head_dim, "ssm_state_size": state,
            "ssm_groups": groups, "ssm_conv_kernel": conv, "ssm_eps": eps}


def mamba2(d: dict) -> dict:
    n = int(d["num_hidden_layers"])
    hidden = int(d["hidden_size"])
    heads = int(d["num_heads"])
    inner = int(d.get("expand", 2)) * hidden
    return {**_common({**d, "num_attention_heads": 0}, n),
            "layer_types": ("mamba2",) * n, "mlp_types": ("none",) * n,
            **_mamba2_layers(d, heads, int(d.get("head_dim") or inner // heads),
                             int(d["state_size"]), int(d.get("n_groups", 1)),
                             int(d.get("conv_kernel", 4)),
                             float(d.get("layer_norm_epsilon", 1e-5))),
            "rms_norm_eps": float(d.get("layer_norm_epsilon", 1e-5)),
            "ssm_conv_bias": bool(d.get("use_conv_bias", True)),
            "ssm_in_bias": bool(d.get("use_bias", False)),
            "ssm_out_bias": bool(d.get("use_bias", False)),
            "ssm_dt_limit": _limit(d)}


# Nemotron-H's pattern letters and layers_block_type names -> (mixer, MLP)
_NEMOTRON = {"M": ("mamba2", "none"), "*": ("full_attention", "none"), "-": ("none", "dense"),
             "mamba": ("mamba2", "none"), "linear_attention": ("mamba2", "none"),
             "attention": ("full_attention", "none"), "full_attention": ("full_attention", "none"),
             "mlp": ("none", "dense")}


def nemotron_h(d: dict) -> dict:
    pattern = d.get("hybrid_override_pattern") or d.get("layers_block_type")
    if not pattern:
        raise KeyError("hybrid_override_pattern")
    kinds = list(pattern)
    bad = [k for k in kinds if k not in _NEMOTRON]
    if bad:
        raise ValueError(f"config: nemotron_h layer kind {bad[0]!r} is not supported "
                         "(supported: mamba, attention, mlp; not the MoE variant)")
    n = len(kinds)
    eps = float(d.get("layer_norm_epsilon", 1e-5))
    act = d.get("mlp_hidden_act", "relu2")
    if act != "relu2":
        raise ValueError(f"config: nemotron_h mlp_hidden_act {act!r} is not supported")
    return {**_common(d, n),
            "layer_types": tuple(_NEMOTRON[k][0] for k in kinds),
            "mlp_types": tuple(_NEMOTRON[k][1] for k in kinds),
            **_mamba2_layers(d, int(d["mamba_num_heads"]), int(d["mamba_head_dim"]),
                             int(d["ssm_state_size"]), int(d.get("n_groups", 1)),
                             int(d.get("conv_kernel", 4)), eps),
            "partial_rotary_factor": 0.0,          # no position embedding at all
            "rms_norm_eps": eps,
            "ssm_conv_bias": bool(d.get("use_conv_bias", True)),
            "ssm_in_bias": bool(d.get("use_bias", False)),
            "ssm_out_bias": bool(d.get("use_bias", False)),
            # transformers' NemotronHMamba2Mixer clamps the time step at time_step_min
            "ssm_dt_limit": (float(d.get("time_step_min", 0.001)), math.inf),
            "mlp_act": "relu2", "mlp_bias": bool(d.get("mlp_bias", False))}


def _granite_kinds(d: dict, n: int) -> list[str]:
    kinds = d.get("layer_types") or d.get("layers_block_type") or ["mamba"] * n
    table = {"mamba": "mamba2", "linear_attention": "mamba2", "attention": "full_attention",
             "full_attention": "full_attention"}
    bad = [k for k in kinds if k not in table]
    if bad or len(kinds) != n:
        raise ValueError(f"config: granitemoehybrid layer_types {kinds!r} are not "
                         f"{n} of mamba / attention")
    return [table[k] for k in kinds]


def granitemoehybrid(d: dict) -> dict:
    n = int(d["num_hidden_layers"])
    hidden = int(d["hidden_size"])
    heads = int(d.get("mamba_n_heads", 128))
    head_dim = d.get("mamba_d_head", "auto")
    head_dim = int(d.get("mamba_expand", 2)) * hidden // heads if head_dim == "auto" \
        else int(head_dim)
    experts = int(d.get("num_local_experts") or 0)
    eps = float(d.get("rms_norm_eps", 1e-6))
    rope = d.get("position_embedding_type") == "rope"
    return {**_common(d, n),
            "layer_types": tuple(_granite_kinds(d, n)),
            "mlp_types": ("moe" if experts else "none",) * n,
            **_mamba2_layers(d, heads, head_dim, int(d.get("mamba_d_state", 256)),
                             int(d.get("mamba_n_groups", 1)), int(d.get("mamba_d_conv", 4)),
                             eps),
            "partial_rotary_factor": 1.0 if rope else 0.0,
            "rms_norm_eps": eps,
            "ssm_conv_bias": bool(d.get("mamba_conv_bias", True)),
            "ssm_in_bias": bool(d.get("mamba_proj_bias", False)),
            "ssm_out_bias": bool(d.get("mamba_proj_bias", False)),
            "ssm_dt_limit": _limit(d),
            "num_experts": experts, "num_experts_per_tok": int(d.get("num_experts_per_tok") or 0),
            # the experts' size is intermediate_size; the shared MLP's its own
            "moe_intermediate_size": int(d.get("intermediate_size") or 0),
            "norm_topk_prob": True,   # softmax over the top-k logits: renormalised top-k
            "shared_mlp_size": int(d.get("shared_intermediate_size") or 0),
            "embedding_multiplier": float(d.get("embedding_multiplier", 1.0)),
            "residual_multiplier": float(d.get("residual_multiplier", 1.0)),
            "logits_multiplier": 1.0 / float(d.get("logits_scaling", 1.0)),
            "attention_scale": float(d.get("attention_multiplier", 1.0))}


def falcon_h1(d: dict) -> dict:
    n = int(d["num_hidden_layers"])
    hidden = int(d["hidden_size"])
    inner = int(d.get("mamba_d_ssm") or int(d.get("mamba_expand", 2)) * hidden)
    heads = int(d.get("mamba_n_heads", 128))
    head_dim = d.get("mamba_d_head", "auto")
    head_dim = inner // heads if head_dim == "auto" else int(head_dim)
    eps = float(d.get("rms_norm_eps", 1e-5))
    return {**_common(d, n),
            "layer_types": ("parallel",) * n, "mlp_types": ("dense",) * n,
            **_mamba2_layers(d, heads, head_dim, int(d.get("mamba_d_state", 256)),
                             int(d.get("mamba_n_groups", 1)), int(d.get("mamba_d_conv", 4)),
                             eps),
            "partial_rotary_factor": 1.0,
            "rms_norm_eps": eps,
            "ssm_conv_bias": bool(d.get("mamba_conv_bias", True)),
            "ssm_in_bias": bool(d.get("mamba_proj_bias", False)),
            "ssm_out_bias": bool(d.get("projectors_bias", False)),
            "ssm_norm": bool(d.get("mamba_rms_norm", False)),
            "ssm_norm_before_gate": bool(d.get("mamba_norm_before_gate", True)),
            "ssm_dt_limit": _limit(d),
            "mlp_bias": bool(d.get("mlp_bias", False)),
            "embedding_multiplier": float(d.get("embedding_multiplier", 1.0)),
            "logits_multiplier": float(d.get("lm_head_multiplier", 1.0)),
            "attention_in_multiplier": float(d.get("attention_in_multiplier", 1.0)),
            "attention_out_multiplier": float(d.get("attention_out_multiplier", 1.0)),
            "key_multiplier": float(d.get("key_multiplier", 1.0)),
            "ssm_in_multiplier": float(d.get("ssm_in_multiplier", 1.0)),
            "ssm_out_multiplier": float(d.get("ssm_out_multiplier", 1.0)),
            "ssm_multipliers": tuple(float(m) for m in d.get("ssm_multipliers")
                                     or (1.0,) * 5),
            "mlp_multipliers": tuple(float(m) for m in d.get("mlp_multipliers")
                                     or (1.0, 1.0))}


def jamba(d: dict) -> dict:
    n = int(d["num_hidden_layers"])
    hidden = int(d["hidden_size"])
    a_period, a_offset = int(d.get("attn_layer_period", 8)), int(d.get("attn_layer_offset", 4))
    e_period, e_offset = (int(d.get("expert_layer_period", 2)),
                          int(d.get("expert_layer_offset", 1)))
    experts = int(d.get("num_experts") or d.get("num_local_experts") or 1)
    rank = d.get("mamba_dt_rank", "auto")
    eps = float(d.get("rms_norm_eps", 1e-6))
    # transformers derives these lists from the periods; a GGUF's config gives them
    kinds = d.get("layers_block_type") or ["attention" if i % a_period == a_offset else "mamba"
                                           for i in range(n)]
    per_layer = d.get("layers_num_experts") or [experts if i % e_period == e_offset else 1
                                                for i in range(n)]
    if len(kinds) != n or len(per_layer) != n or set(kinds) - {"attention", "mamba"}:
        raise ValueError(f"config: jamba layer kinds {kinds!r} are not {n} of mamba / attention")
    return {**_common(d, n),
            "layer_types": tuple("full_attention" if k == "attention" else "mamba"
                                 for k in kinds),
            "mlp_types": tuple("moe" if e > 1 else "dense" for e in per_layer),
            "ssm_heads": 1, "ssm_head_dim": int(d.get("mamba_expand", 2)) * hidden,
            "ssm_state_size": int(d.get("mamba_d_state", 16)),
            "ssm_conv_kernel": int(d.get("mamba_d_conv", 4)),
            "ssm_dt_rank": math.ceil(hidden / 16) if rank == "auto" else int(rank),
            "ssm_eps": eps, "ssm_norm": False,
            "partial_rotary_factor": 0.0,          # no position embedding at all
            "rms_norm_eps": eps,
            "ssm_conv_bias": bool(d.get("mamba_conv_bias", True)),
            "ssm_in_bias": bool(d.get("mamba_proj_bias", False)),
            "ssm_out_bias": bool(d.get("mamba_proj_bias", False)),
            "num_experts": experts if experts > 1 else 0,
            "num_experts_per_tok": int(d.get("num_experts_per_tok") or 0),
            "moe_intermediate_size": int(d.get("intermediate_size") or 0),
            "norm_topk_prob": False}     # Jamba keeps the top-k softmax weights as they are


FAMILIES = {"mamba2": mamba2, "nemotron_h": nemotron_h, "granitemoehybrid": granitemoehybrid,
            "falcon_h1": falcon_h1, "jamba": jamba}

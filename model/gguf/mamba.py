"""llama.cpp's state space hybrid GGUFs back to a config and the model's weights:
`mamba2`, `nemotron_h` (and `nemotron_h_moe`, which the converter writes for any
Nemotron-H when transformers 5 gives it the MoE keys' defaults), `granitehybrid`
(Granite-4.0-H), `falcon-h1` and `jamba`.

What llama.cpp's converter (conversion/mamba.py, granite.py, nemotron.py,
falcon_h1.py, jamba.py) did, and what is undone here:
- A_log is stored as ssm_a = -exp(A_log) ([H, 1] for Mamba2, [D, N] for Jamba); D as
  ssm_d ([H, 1]); the gated norm's weight as [groups, inner / groups]; conv1d
  [C, 1, K] squeezed to [C, K]; Mamba2's dt_bias is ssm_dt.bias;
- Granite-4.0-H and Nemotron-H go through its llama conversion, which permutes the
  q/k rows for its rotary layout (they have no rotary: the permutation is undone all
  the same); Granite's fused expert and shared MLP tensors are split into gate / up;
- Falcon-H1's multipliers are folded into the weights (the config here says 1.0);
- the metadata that the converter writes wrong for transformers 5 configs (Nemotron-H's
  MLP sizes, Granite's attention layers) is not read: each layer's kind and sizes come
  from its tensors.
The tensors come out under the model's own names (arch/ssm_lm.py), which
model/ssm_checkpoint.py passes through.
"""

from __future__ import annotations

import torch

from ckptd.model.checkpoint import Recipe, plain
from ckptd.model.gguf.experts import expert_recipes
from ckptd.model.gguf.reader import GGUFTensors, convert_tensors, field, scalar, unpermute

ARCHS = ("mamba2", "nemotron_h", "nemotron_h_moe", "granitehybrid", "falcon-h1", "jamba")
MODEL_TYPES = {"mamba2": "mamba2", "nemotron_h": "nemotron_h", "nemotron_h_moe": "nemotron_h",
               "granitehybrid": "granitemoehybrid", "falcon-h1": "falcon_h1",
               "jamba": "jamba"}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_ATTN = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj"}
_SSM = {"ssm_in": "mamba.in_proj", "ssm_out": "mamba.out_proj", "ssm_x": "mamba.x_proj",
        "ssm_conv1d": "mamba.conv1d", "ssm_dt_norm": "mamba.dt_layernorm",
        "ssm_b_norm": "mamba.b_layernorm", "ssm_c_norm": "mamba.c_layernorm"}
_MOE = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_SHARED = {"ffn_gate_shexp": "shared_mlp.gate_proj", "ffn_up_shexp": "shared_mlp.up_proj",
           "ffn_down_shexp": "shared_mlp.down_proj"}


class _Meta:
    """The <arch>.* metadata; ValueError naming a required key that is absent."""

    def __init__(self, reader, arch: str) -> None:
        self.reader, self.arch = reader, arch

    def get(self, key: str, default=None):
        return field(self.reader, f"{self.arch}.{key}", default)

    def need(self, key: str):
        v = self.get(key)
        if v is None:
            raise ValueError(f"{self.arch} GGUF lacks the metadata key {self.arch}.{key}")
        return v


def load_ssm_hybrid(reader, tensors: GGUFTensors, arch: str) -> tuple[dict, dict[str, Recipe]]:
    meta = _Meta(reader, arch)
    n = int(meta.need("block_count"))
    has = lambda i, part: f"blk.{i}.{part}.weight" in tensors    # noqa: E731
    mixers = ["parallel" if has(i, "ssm_in") and has(i, "attn_q") else
              "mamba" if has(i, "ssm_in") else "attention" if has(i, "attn_q") else "none"
              for i in range(n)]
    moe = {i for i in range(n) if has(i, "ffn_gate_inp")}
    if moe and arch.startswith("nemotron_h"):
        raise ValueError(f"{tensors.path or 'GGUF'}: Nemotron-H's mixture-of-experts variant "
                         f"(layer {min(moe)} has experts) is not supported")
    cfg = _config(meta, tensors, n, mixers)
    kv = meta.get("attention.head_count_kv", cfg.get("num_attention_heads", 0))
    heads = {"attn_q": cfg.get("num_attention_heads", 0),
             "attn_k": max(kv) if isinstance(kv, list) else int(kv)}
    permuted = arch in ("granitehybrid", "nemotron_h", "nemotron_h_moe")

    def block(i: int, part: str):
        stem, _, suffix = part.partition(".")
        name = f"blk.{i}.{part}"
        if i in moe and stem in _MOE and suffix == "weight":
            if stem == "ffn_gate_inp":
                return [(f"model.layers.{i}.mlp.gate.weight", plain(lambda: tensors.get(name)))]
            return expert_recipes(tensors, i, part)
        hf = _name(arch, mixers[i], stem, suffix)
        if hf is None:
            return None
        get = lambda: _convert(stem, tensors.get(name))              # noqa: E731
        if permuted and stem in heads:
            get = lambda: unpermute(tensors.get(name), heads[stem])  # noqa: E731
        return [(f"model.layers.{i}.{hf}", plain(get))]

    out = convert_tensors(tensors, n, _TOP, block)
    cfg["tie_word_embeddings"] = "lm_head.weight" not in out
    return cfg, out


def _name(arch: str, mixer: str, stem: str, suffix: str) -> str | None:
    """The model's parameter of a block tensor (None: not one this loader knows)."""
    if stem in ("ssm_a", "ssm_d") or (stem == "ssm_dt" and arch != "jamba"):
        return {"ssm_a": "mamba.A_log", "ssm_d": "mamba.D", "ssm_dt": "mamba.dt_bias"}[stem]
    if stem in _ATTN or stem in _SSM or stem in _SHARED:
        module = {**_ATTN, **_SSM, **_SHARED}[stem]
    elif stem in ("ssm_norm", "ssm_dt"):
        module = "mamba.norm" if stem == "ssm_norm" else "mamba.dt_proj"
    elif stem == "attn_norm":
        module = "input_layernorm" if mixer != "none" else "post_attention_layernorm"
    elif stem == "ffn_norm":                  # Falcon-H1's is written without ".weight"
        module = "post_attention_layernorm"
    elif stem in ("ffn_gate", "ffn_up", "ffn_down"):
        # Granite without experts keeps its always-on MLP as the plain one
        module = ("shared_mlp" if arch == "granitehybrid" else "mlp") + f".{stem[4:]}_proj"
    else:
        return None
    return f"{module}.{suffix or 'weight'}"


def _convert(stem: str, w: torch.Tensor) -> torch.Tensor:
    if stem == "ssm_a":                       # -exp(A_log)
        return torch.log(-w.float()).reshape(w.shape[0], -1).squeeze(-1)
    if stem in ("ssm_d", "ssm_norm"):
        return w.reshape(-1)
    if stem == "ssm_conv1d" and w.dim() == 2:
        return w.unsqueeze(1)
    return w


def _shape(tensors: GGUFTensors, name: str) -> tuple[int, ...] | None:
    return tensors.shape(name) if name in tensors else None


def _config(meta: _Meta, tensors: GGUFTensors, n: int, mixers: list[str]) -> dict:
    """A transformers-style config dict of the family (model/ssm_families.py reads it)."""
    arch = meta.arch
    embd = _shape(tensors, "token_embd.weight")
    if embd is None:
        raise ValueError(f"GGUF {tensors.path or ''} is missing tensor 'token_embd.weight'")
    hidden = int(meta.need("embedding_length"))
    eps = scalar(meta.get("attention.layer_norm_rms_epsilon",
                          meta.get("attention.layer_norm_epsilon", 1e-5)))
    first = next((i for i in range(n) if mixers[i] in ("mamba", "parallel")), None)
    inner = int(meta.need("ssm.inner_size"))
    rank = int(meta.need("ssm.time_step_rank"))       # Mamba2: the heads; Jamba: dt rank
    heads = int(meta.get("attention.head_count", 0) or 0)
    kv = meta.get("attention.head_count_kv", heads)
    kv = max(kv) if isinstance(kv, list) else int(kv or 0)
    b = lambda part: first is not None and f"blk.{first}.{part}" in tensors   # noqa: E731
    cfg = {"model_type": MODEL_TYPES[arch], "vocab_size": int(embd[0]), "hidden_size": hidden,
           "num_hidden_layers": n, "num_attention_heads": heads, "num_key_value_heads": kv,
           "head_dim": int(meta.get("attention.key_length", hidden // heads if heads else 0)),
           "max_position_embeddings": int(meta.get("context_length", 1 << 20)),
           "rope_theta": scalar(meta.get("rope.freq_base", 10000.0)),
           "attention_bias": any(f"blk.{i}.attn_q.bias" in tensors for i in range(n)),
           "bos_token_id": field(meta.reader, "tokenizer.ggml.bos_token_id"),
           "eos_token_id": field(meta.reader, "tokenizer.ggml.eos_token_id")}
    d_state, groups = int(meta.need("ssm.state_size")), int(meta.get("ssm.group_count", 1))
    conv = int(meta.need("ssm.conv_kernel"))
    dense = next((s for i in range(n) for s in (_shape(tensors, f"blk.{i}.ffn_up.weight"),)
                  if s is not None), None)
    experts = next((s for i in range(n) for s in (_shape(tensors, f"blk.{i}.ffn_up_exps.weight"),)
                    if s is not None), None)
    if arch == "mamba2":
        cfg.update(num_heads=rank, head_dim=inner // rank, state_size=d_state, n_groups=groups,
                   conv_kernel=conv, expand=inner // hidden, layer_norm_epsilon=eps,
                   use_conv_bias=b("ssm_conv1d.bias"), use_bias=b("ssm_in.bias"))
    elif arch.startswith("nemotron_h"):
        letters = {"mamba": "M", "attention": "*", "none": "-"}
        cfg.update(hybrid_override_pattern="".join(letters[m] for m in mixers),
                   mamba_num_heads=rank, mamba_head_dim=inner // rank, ssm_state_size=d_state,
                   n_groups=groups, conv_kernel=conv, layer_norm_epsilon=eps,
                   use_conv_bias=b("ssm_conv1d.bias"), use_bias=b("ssm_in.bias"),
                   intermediate_size=dense[0] if dense else 0, mlp_hidden_act="relu2",
                   mlp_bias=any(f"blk.{i}.ffn_up.bias" in tensors for i in range(n)))
    elif arch == "granitehybrid":
        shared = _shape(tensors, "blk.0.ffn_up_shexp.weight") or dense
        cfg.update(layer_types=["mamba" if m == "mamba" else "attention" for m in mixers],
                   mamba_n_heads=rank, mamba_d_head=inner // rank, mamba_d_state=d_state,
                   mamba_n_groups=groups, mamba_d_conv=conv, rms_norm_eps=eps,
                   mamba_conv_bias=b("ssm_conv1d.bias"), mamba_proj_bias=b("ssm_in.bias"),
                   num_local_experts=experts[0] if experts else 0,
                   num_experts_per_tok=int(meta.get("expert_used_count", 0) or 0),
                   intermediate_size=experts[1] if experts else 0,
                   shared_intermediate_size=shared[0] if shared else 0,
                   # the converter says whether attention rotates here (use_rope)
                   position_embedding_type="rope" if meta.get("rope.scaling.finetuned")
                   else "nope",
                   attention_multiplier=scalar(meta.get("attention.scale", 1.0)),
                   embedding_multiplier=scalar(meta.get("embedding_scale", 1.0)),
                   residual_multiplier=scalar(meta.get("residual_scale", 1.0)),
                   logits_scaling=scalar(meta.get("logit_scale", 1.0)))
    elif arch == "falcon-h1":
        cfg.update(mamba_d_ssm=inner, mamba_n_heads=rank, mamba_d_head=inner // rank,
                   mamba_d_state=d_state, mamba_n_groups=groups, mamba_d_conv=conv,
                   mamba_rms_norm=b("ssm_norm.weight"), mamba_norm_before_gate=False,
                   mamba_conv_bias=b("ssm_conv1d.bias"), mamba_proj_bias=b("ssm_in.bias"),
                   projectors_bias=b("ssm_out.bias"), rms_norm_eps=eps,
                   intermediate_size=dense[0] if dense else 0)
    else:                                                               # jamba
        cfg.update(layers_block_type=["attention" if m == "attention" else "mamba"
                                      for m in mixers],
                   layers_num_experts=[experts[0] if f"blk.{i}.ffn_gate_inp.weight" in tensors
                                       else 1 for i in range(n)],
                   num_experts=experts[0] if experts else 1,
                   num_experts_per_tok=int(meta.get("expert_used_count", 0) or 0),
                   intermediate_size=experts[1] if experts else dense[0] if dense else 0,
                   mamba_d_state=d_state, mamba_d_conv=conv, mamba_expand=inner // hidden,
                   mamba_dt_rank=rank, mamba_conv_bias=b("ssm_conv1d.bias"),
                   mamba_proj_bias=b("ssm_in.bias"), rms_norm_eps=eps)
    return cfg

"""llama.cpp's Qwen hybrid GGUFs back to Hugging Face names and values:
`qwen35` (dense Qwen3.5), `qwen35moe` (Qwen3.5/3.6-MoE) and `qwen3next` (Qwen3-Next):
Gated DeltaNet + gated attention, with a dense MLP or a sparse mixture of experts.

What llama.cpp's converter (conversion/qwen.py: Qwen3NextModel,
_LinearAttentionVReorderBase, Qwen2MoeModel) did, and what is undone here:
- every RMSNorm weight except the DeltaNet output norm is stored as weight + 1
  (HF keeps them zero-centred and adds 1 at run time);
- A_log is stored as ssm_a = -exp(A_log); dt_bias is ssm_dt.bias;
- conv1d [C, 1, K] is squeezed to [C, K];
- qwen35 / qwen35moe, when there are fewer key heads than value heads: every value-head
  axis (the V rows of in_proj_qkv and the V conv channels, in_proj_z rows, in_proj_a/b
  rows, A_log, dt_bias, out_proj columns) is reordered from grouped-by-key-head
  [hk, r, d] to tiled [r, hk, d] for ggml's broadcast;
- qwen3next: in_proj_qkvz is split into attn_qkv ([q; k; v], value heads grouped) and
  attn_gate (z), in_proj_ba is kept as ssm_ba (model/checkpoint.py splits it);
- experts are stacked per projection (ffn_{gate,up,down}_exps [E, ...]); gate and up
  become transformers' experts.gate_up_proj here (model/gguf/experts.py);
- the gated q_proj (query and gate interleaved per head) is kept as is.
Multi-token-prediction layers (blk.N for N >= the trunk's layers) are dropped.
"""

from __future__ import annotations

import torch

from ckptd.model.checkpoint import Recipe, plain
from ckptd.model.gguf.experts import MOE_PARTS, expert_recipes, moe_config
from ckptd.model.gguf.reader import GGUFTensors, convert_tensors, field, require, scalar

MODEL_TYPES = {"qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text",
               "qwen3next": "qwen3_next"}
_CLASSES = {"qwen35": "Qwen3_5ForCausalLM", "qwen35moe": "Qwen3_5MoeForCausalLM",
            "qwen3next": "Qwen3NextForCausalLM"}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_COMMON = {"attn_norm.weight": "input_layernorm.weight",
           "post_attention_norm.weight": "post_attention_layernorm.weight"}
_DENSE = {"ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
          "ffn_down.weight": "mlp.down_proj.weight"}
_ATTN = {"attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
         "attn_v.weight": "self_attn.v_proj.weight",
         "attn_output.weight": "self_attn.o_proj.weight",
         "attn_q_norm.weight": "self_attn.q_norm.weight",
         "attn_k_norm.weight": "self_attn.k_norm.weight"}
_LINEAR = {"attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
           "attn_gate.weight": "linear_attn.in_proj_z.weight",
           "ssm_a": "linear_attn.A_log", "ssm_dt.bias": "linear_attn.dt_bias",
           "ssm_conv1d.weight": "linear_attn.conv1d.weight",
           "ssm_norm.weight": "linear_attn.norm.weight",
           "ssm_out.weight": "linear_attn.out_proj.weight"}
_BETA_ALPHA = {"qwen3next": {"ssm_ba.weight": "linear_attn.in_proj_ba.weight"}}
_SPLIT_BA = {"ssm_beta.weight": "linear_attn.in_proj_b.weight",
             "ssm_alpha.weight": "linear_attn.in_proj_a.weight"}
# stored as weight + 1
_PLUS_ONE = ("attn_norm.weight", "post_attention_norm.weight", "attn_q_norm.weight",
             "attn_k_norm.weight")


def load_qwen_hybrid(reader, tensors: GGUFTensors, arch: str
                     ) -> tuple[dict, dict[str, Recipe]]:
    cfg = qwen_config(reader, tensors, arch)
    n = cfg["num_hidden_layers"]
    kinds = cfg["layer_types"]
    linear = {**_LINEAR, **_BETA_ALPHA.get(arch, _SPLIT_BA)}
    sparse = cfg.get("mlp_types") or ["dense"] * n
    moe = [p for p in MOE_PARTS
           if cfg.get("shared_expert_intermediate_size") or "shexp" not in p]
    require(tensors, ["token_embd.weight", "output_norm.weight"] + [
        f"blk.{i}.{p}" for i in range(n)
        for p in (*_COMMON, *(_ATTN if kinds[i] == "full_attention" else linear),
                  *(moe if sparse[i] == "moe" else _DENSE))])
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    key_dim = hk * cfg["linear_key_head_dim"]
    dv = cfg["linear_value_head_dim"]
    tiled = arch != "qwen3next" and hk != hv

    def untile(t: torch.Tensor, dim: int, d: int) -> torch.Tensor:
        """Value heads along `dim` from tiled [r, hk, d] back to grouped [hk, r, d]."""
        if not tiled:
            return t
        shape = list(t.shape)
        t = t.reshape(shape[:dim] + [hv // hk, hk, d] + shape[dim + 1:])
        return t.transpose(dim, dim + 1).reshape(shape)

    def convert(part: str, w: torch.Tensor) -> torch.Tensor:
        if part in _PLUS_ONE:
            return w - 1.0
        if part == "attn_qkv.weight":
            return torch.cat([w[:2 * key_dim], untile(w[2 * key_dim:], 0, dv)])
        if part == "attn_gate.weight":
            return untile(w, 0, dv)
        if part in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_dt.bias"):
            return untile(w, 0, 1)
        if part == "ssm_a":
            return untile(torch.log(-w), 0, 1)
        if part == "ssm_conv1d.weight":   # [C, K] -> [C, 1, K]
            return torch.cat([w[:2 * key_dim], untile(w[2 * key_dim:], 0, dv)]).unsqueeze(1)
        if part == "ssm_out.weight":
            return untile(w, 1, dv)
        return w

    def block(i: int, part: str):
        if sparse[i] == "moe" and part in MOE_PARTS:
            return expert_recipes(tensors, i, part)
        table = _ATTN if kinds[i] == "full_attention" else linear
        hf = _COMMON.get(part) or table.get(part) or \
            (_DENSE.get(part) if sparse[i] == "dense" else None)
        if hf is None:
            return None
        name = f"blk.{i}.{part}"
        return [(f"model.layers.{i}.{hf}", plain(lambda: convert(part, tensors.get(name))))]

    def mtp(name: str) -> bool:
        parts = name.split(".")
        return parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) >= n

    out = convert_tensors(tensors, n, _TOP, block, skip=mtp)
    norm = out["model.norm.weight"]
    out["model.norm.weight"] = lambda dtype, device: norm(dtype, device) - 1.0
    cfg["tie_word_embeddings"] = "lm_head.weight" not in out
    cfg.pop("mlp_types", None)
    return cfg, out


def qwen_config(reader, tensors: GGUFTensors, arch: str) -> dict:
    """A transformers config dict (Qwen3_5TextConfig, Qwen3_5MoeTextConfig or
    Qwen3NextConfig) from the <arch>.* metadata."""
    a = arch

    def need(key: str):
        v = field(reader, f"{a}.{key}")
        if v is None:
            raise ValueError(f"{a} GGUF lacks the metadata key {a}.{key}")
        return v

    embd = tensors.by_name.get("token_embd.weight")
    if embd is None:
        raise ValueError(f"GGUF {tensors.path or ''} is missing tensor 'token_embd.weight'")
    n = int(need("block_count")) - int(field(reader, f"{a}.nextn_predict_layers", 0))
    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    head_dim = int(field(reader, f"{a}.attention.key_length", hidden // heads))
    kv = field(reader, f"{a}.attention.head_count_kv", heads)
    if isinstance(kv, list):  # per layer, 0 on recurrent layers
        kv = max(kv)
    dt_rank = int(need("ssm.time_step_rank"))
    recurrent = field(reader, f"{a}.attention.recurrent_layers")
    interval = int(field(reader, f"{a}.full_attention_interval", 4))
    if recurrent is not None:
        kinds = ["linear_attention" if r else "full_attention" for r in recurrent[:n]]
    else:
        kinds = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                 for i in range(n)]
    rope_dim = int(field(reader, f"{a}.rope.dimension_count", head_dim // 4))
    rope = {"rope_type": "default", "rope_theta": scalar(field(reader, f"{a}.rope.freq_base",
                                                              10000000.0)),
            "partial_rotary_factor": rope_dim / head_dim}
    sections = field(reader, f"{a}.rope.dimension_sections")
    if sections and sum(int(s) for s in sections) == rope_dim // 2:
        rope.update(mrope_section=[int(s) for s in sections[:3]], mrope_interleaved=True)
    cfg = {
        "model_type": MODEL_TYPES[arch],
        "architectures": [_CLASSES[arch]],
        "vocab_size": int(embd.shape[1]),
        "hidden_size": hidden,
        "num_hidden_layers": n,
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": scalar(field(reader, f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(field(reader, f"{a}.context_length", 32768)),
        "rope_parameters": rope,
        "attention_bias": False,
        "layer_types": kinds,
        "full_attention_interval": interval,
        "linear_conv_kernel_dim": int(need("ssm.conv_kernel")),
        "linear_key_head_dim": int(need("ssm.state_size")),
        "linear_value_head_dim": int(need("ssm.inner_size")) // dt_rank,
        "linear_num_key_heads": int(need("ssm.group_count")),
        "linear_num_value_heads": dt_rank,
        "tie_word_embeddings": False,
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
    }
    ffn = field(reader, f"{a}.feed_forward_length")
    if ffn is not None:
        cfg["intermediate_size"] = int(ffn)
    elif arch == "qwen35":
        need("feed_forward_length")
    if arch != "qwen35":
        cfg.update(moe_config(reader, tensors, arch, n))
    return cfg

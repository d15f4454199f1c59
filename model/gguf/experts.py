"""The sparse MoE tensors of llama.cpp's qwen35moe / qwen3next GGUFs, under transformers'
names (Qwen3_5MoeSparseMoeBlock / Qwen3NextSparseMoeBlock).

    ffn_gate_inp        [E, H]     -> mlp.gate.weight                      (router)
    ffn_{gate,up}_exps  [E, I, H]  -> mlp.experts.gate_up_proj [E, 2I, H]  (gate rows first)
    ffn_down_exps       [E, H, I]  -> mlp.experts.down_proj
    ffn_{gate,up,down}_shexp       -> mlp.shared_expert.{gate,up,down}_proj.weight
    ffn_gate_inp_shexp  [1, H]     -> mlp.shared_expert_gate.weight
"""

from __future__ import annotations

import torch

from ckptd.model.checkpoint import Recipe, plain
from ckptd.model.gguf.reader import GGUFTensors, field
from ckptd.model.quant import KeptGateUp

MOE_PARTS = ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
             "ffn_down_exps.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
             "ffn_down_shexp.weight", "ffn_gate_inp_shexp.weight")
_SIMPLE = {"ffn_gate_inp.weight": "mlp.gate.weight",
           "ffn_down_exps.weight": "mlp.experts.down_proj",
           "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
           "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
           "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
           "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight"}
_SOFTMAX = 1          # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX


def moe_config(reader, tensors: GGUFTensors, arch: str, n_layers: int) -> dict:
    """The MoE keys of a transformers config from <arch>.expert_* metadata. A layer is
    sparse where its router tensor is present (Qwen3-Next's mlp_only_layers)."""
    a = arch

    def need(key: str) -> int:
        v = field(reader, f"{a}.{key}")
        if v is None:
            raise ValueError(f"{a} GGUF lacks the metadata key {a}.{key}")
        return int(v)

    gating = field(reader, f"{a}.expert_gating_func")
    if gating is not None and int(gating) != _SOFTMAX:
        raise ValueError(f"{a} GGUF routes experts with gating function {gating}; "
                         "only softmax (1) is supported")
    sparse = [f"blk.{i}.ffn_gate_inp.weight" in tensors for i in range(n_layers)]
    cfg = {
        "num_experts": need("expert_count"),
        "num_experts_per_tok": need("expert_used_count"),
        "moe_intermediate_size": need("expert_feed_forward_length"),
        "shared_expert_intermediate_size":
            int(field(reader, f"{a}.expert_shared_feed_forward_length", 0)),
        # llama.cpp renormalises the top-k weights of both unless the file says otherwise
        "norm_topk_prob": bool(field(reader, f"{a}.expert_weights_norm", True)),
        "mlp_types": ["moe" if s else "dense" for s in sparse],
    }
    if arch == "qwen3next":
        cfg.update(decoder_sparse_step=1, mlp_only_layers=[i for i, s in enumerate(sparse)
                                                           if not s])
    elif not all(sparse):
        raise ValueError(f"{a} GGUF: layer {sparse.index(False)} has no expert router "
                         "(ffn_gate_inp); every Qwen3.5-MoE layer is sparse")
    return cfg


def expert_recipes(tensors: GGUFTensors, i: int, part: str) -> list[tuple[str, Recipe]]:
    """(HF name, recipe) pairs for blk.<i>.<part>: none for ffn_up_exps, which the
    gate_up recipe of ffn_gate_exps reads."""
    p = f"model.layers.{i}."
    if part == "ffn_up_exps.weight":
        return []
    if part == "ffn_gate_exps.weight":
        gate, up = f"blk.{i}.ffn_gate_exps.weight", f"blk.{i}.ffn_up_exps.weight"

        def gate_up(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            kept = tensors.kept(gate), tensors.kept(up)     # --weights keep: as stored
            if kept[0] is not None and kept[1] is not None:
                return KeptGateUp(*kept)
            g = tensors.get(gate)
            dst = torch.empty(g.shape[0], 2 * g.shape[1], g.shape[2], dtype=dtype,
                              device=device)
            dst[:, :g.shape[1]] = g
            dst[:, g.shape[1]:] = tensors.get(up)
            return dst
        return [(p + "mlp.experts.gate_up_proj", gate_up)]
    name = f"blk.{i}.{part}"
    if part == "ffn_down_exps.weight":
        def down(dtype: torch.dtype, device: torch.device):
            kept = tensors.kept(name)                       # --weights keep: as stored
            return kept if kept is not None else tensors.get(name).to(device, dtype)
        return [(p + _SIMPLE[part], down)]
    return [(p + _SIMPLE[part], plain(lambda: tensors.get(name)))]

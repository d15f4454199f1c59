"""The sparse mixture-of-experts MLP of Qwen3.5-MoE and Qwen3-Next (transformers'
Qwen3_5MoeSparseMoeBlock / Qwen3NextSparseMoeBlock, same tensor names).

    router logits = gate(x)                          [N, E]
    probs = softmax(logits) in fp32; top-k; renormalised when norm_topk_prob
    out = sum over the k experts of weight * expert(x)           (kernels: ops.moe_experts)
        + sigmoid(shared_expert_gate(x)) * shared_expert(x)

The experts are one tensor per projection, as transformers keeps them:
experts.gate_up_proj [E, 2I, H] (gate rows, then up rows) and experts.down_proj
[E, H, I]; the loader stacks checkpoints that store one tensor per expert.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ckptd.kernels import ops
from ckptd.model.arch.layers import Matmul, fuse_linears, matmul_of
from ckptd.model.config import ModelConfig


class Experts(nn.Module):
    def __init__(self, n_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(n_experts, hidden, intermediate))


class SharedExpert(nn.Module):
    """The always-on expert's projections; SparseMoE runs them (fused with its gate)."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)


class SparseMoE(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        H = cfg.hidden_size
        self.top_k = cfg.num_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.gate = nn.Linear(H, cfg.num_experts, bias=False)
        self.experts = Experts(cfg.num_experts, H, cfg.moe_intermediate_size)
        self.shared = cfg.shared_expert_intermediate_size
        if self.shared:
            self.shared_expert = SharedExpert(H, self.shared)
            self.shared_expert_gate = nn.Linear(H, 1, bias=False)
        self.shared_in: Matmul | None = None     # fuse(): [gate_proj; up_proj; expert gate]
        self.shared_out: Matmul | None = None

    def fuse(self) -> None:
        # The router keeps its own matmul: a different product shape can round its fp32
        # logits differently, and a top-k near-tie would then pick another expert.
        if self.shared:
            s = self.shared_expert
            self.shared_in = fuse_linears([s.gate_proj, s.up_proj, self.shared_expert_gate])
            self.shared_out = matmul_of(s.down_proj)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_ids [N, k], topk_weights [N, k] in x's dtype) as transformers routes."""
        probs = F.softmax(F.linear(x, self.gate.weight), dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = self.route(x)
        out = ops.moe_experts(x, ids, weights, self.experts.gate_up_proj,
                              self.experts.down_proj)
        if self.shared:
            out = out + self._shared(x)
        return out

    def _shared(self, x: torch.Tensor) -> torch.Tensor:
        s = self.shared_expert
        if self.shared_in is None:
            y = s.down_proj(ops.silu_and_mul(s.gate_proj(x), s.up_proj(x)))
            return torch.sigmoid(self.shared_expert_gate(x)) * y
        gate, up, g = self.shared_in(x).split([self.shared, self.shared, 1], dim=-1)
        return torch.sigmoid(g) * self.shared_out(ops.silu_and_mul(gate, up))

"""Building blocks shared by the architectures: norm, MLP, paged attention.

Every module works on packed tokens: x [N, hidden] holds the tokens of all
sequences in a step, sliced per sequence by `StepBatch.seqs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kernels import ops
from model.batch import StepBatch
from model.config import ModelConfig
from model.state import DeviceState


@dataclass
class StepContext:
    """Per-step values every layer needs, computed once per forward."""
    batch: StepBatch
    state: DeviceState
    slots: torch.Tensor  # int64 [N]: flat KV slot (page * block_size + offset) of each token
    cos: torch.Tensor    # [N, rotary_dim]
    sin: torch.Tensor

    @classmethod
    def build(cls, batch: StepBatch, state: DeviceState, cfg: ModelConfig) -> StepContext:
        B = state.spec.block_size
        parts = []
        for s in batch.seqs:
            pos = torch.arange(s.ctx_len, s.ctx_len + s.q_len)
            pages = s.page_table.long()[pos // B]
            parts.append(pages * B + pos % B)
        slots = torch.cat(parts).to(state.device) if parts else torch.empty(0, dtype=torch.long)
        cos, sin = ops.rotary_cos_sin(batch.positions, cfg.rotary_dim, cfg.rope_theta)
        return cls(batch, state, slots, cos, sin)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps
        self.offset = offset  # 1.0: weights are stored zero-centred (Qwen3.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps, self.offset)


def fuse_linears(linears: list[nn.Linear], column_major: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for linears that read the same input: their outputs side by
    side. Each linear's parameters become views of it, so they keep their names (and
    state_dict) without a second copy. One matmul instead of several: the weights
    stream once, in one call (a 14-token step: ~25% less matmul time on the CPU).
    column_major: see relay()."""
    weight = torch.cat([m.weight.detach() for m in linears])
    if column_major:
        weight = weight.t().contiguous().t()
    bias = None
    if linears[0].bias is not None:
        bias = torch.cat([m.bias.detach() for m in linears])
    row = 0
    for m in linears:
        n = m.out_features
        m.weight = nn.Parameter(weight[row:row + n], requires_grad=False)
        if bias is not None:
            m.bias = nn.Parameter(bias[row:row + n], requires_grad=False)
        row += n
    return weight, bias


def relay(linear: nn.Linear, column_major: bool) -> None:
    """Store a linear's weight [out, in] column-major (the same values, as the transposed
    view of an [in, out] matrix) when asked. On the CPU, fp32 matmuls of a few rows
    against a column-major weight take MKL's fast path: 14 rows x [3072, 576] in 0.26 ms
    where row-major takes 0.65 (the same from 64 rows up)."""
    if column_major:
        linear.weight = nn.Parameter(linear.weight.detach().t().contiguous().t(),
                                     requires_grad=False)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.gate_up: torch.Tensor | None = None   # fuse(): [gate; up] weight

    def fuse(self, column_major: bool = False) -> None:
        self.gate_up, _ = fuse_linears([self.gate_proj, self.up_proj], column_major)
        relay(self.down_proj, column_major)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        return self.down_proj(ops.silu_and_mul(gate, up))


class Attention(nn.Module):
    """Causal GQA attention over paged KV.

    llama: plain. Qwen3.5 (`gated`): q_proj also yields a per-head output gate,
    q and k get a zero-centred RMSNorm, and only a part of each head is rotated.
    """

    def __init__(self, cfg: ModelConfig, attn_index: int, gated: bool) -> None:
        super().__init__()
        self.attn_index = attn_index
        self.gated = gated
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d * (2 if gated else 1), bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=bias)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=bias)
        if gated:
            self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps, offset=1.0)
            self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps, offset=1.0)
        self.scale = self.d ** -0.5
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None  # fuse()

    def fuse(self, column_major: bool = False) -> None:
        self.qkv = fuse_linears([self.q_proj, self.k_proj, self.v_proj], column_major)
        relay(self.o_proj, column_major)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        kv = self.hkv * self.d
        return F.linear(x, *self.qkv).split([self.q_proj.out_features, kv, kv], dim=-1)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        N = x.shape[0]
        q, k, v = self._project(x)
        gate = None
        if self.gated:
            q, gate = q.view(N, self.h, 2 * self.d).chunk(2, dim=-1)
            gate = gate.reshape(N, self.h * self.d)
        q = q.reshape(N, self.h, self.d)
        k = k.reshape(N, self.hkv, self.d)
        v = v.reshape(N, self.hkv, self.d)
        if self.gated:
            q, k = self.q_norm(q), self.k_norm(k)
        q = ops.apply_rotary(q, ctx.cos, ctx.sin)
        k = ops.apply_rotary(k, ctx.cos, ctx.sin)
        kv = ctx.state.kv
        ops.write_kv(kv, self.attn_index, ctx.slots, k, v)
        out = self._attend(q, kv, ctx.batch)
        out = out.reshape(N, self.h * self.d)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out)

    def _attend(self, q: torch.Tensor, kv: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        seqs = batch.seqs
        if batch.is_decode_only and len(seqs) > 1:
            width = max(len(s.page_table) for s in seqs)
            tables = torch.zeros(len(seqs), width, dtype=torch.int32)
            for i, s in enumerate(seqs):
                tables[i, :len(s.page_table)] = s.page_table
            lens = torch.tensor([s.ctx_len + 1 for s in seqs], dtype=torch.int32)
            order = torch.tensor([s.q_start for s in seqs])
            out = torch.empty_like(q)
            out[order] = ops.paged_decode_attention(q[order], kv, self.attn_index, tables, lens,
                                                    self.scale)
            return out
        out = torch.empty_like(q)
        for s in seqs:
            sl = slice(s.q_start, s.q_start + s.q_len)
            out[sl] = ops.paged_attention(q[sl], kv, self.attn_index, s.page_table, s.ctx_len,
                                          self.scale)
        return out

"""Building blocks shared by the architectures: norm, MLP, paged attention.

Every module works on packed tokens: x [N, hidden] holds the tokens of all
sequences in a step, sliced per sequence by `StepBatch.seqs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ckptd.kernels import ops
from ckptd.kernels.quant.formats import QuantTensor, cat_rows
from ckptd.model.batch import StepBatch
from ckptd.model.config import ModelConfig
from ckptd.model.quant import KeptLinear, KeptMatmul
from ckptd.model.state import DeviceState


@dataclass
class StepContext:
    """Per-step values every layer needs, computed once per forward on the model's
    device (the batch's tensors are there already: model/batch.py)."""
    batch: StepBatch
    state: DeviceState
    cos: torch.Tensor    # [N, rotary_dim]
    sin: torch.Tensor
    # another rotary's (cos, sin) for the layers that ask for it (Gemma 3's local ones)
    local: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def build(cls, batch: StepBatch, state: DeviceState, cfg: ModelConfig) -> StepContext:
        if batch.mrope is not None:     # image tokens: three positions each
            cos, sin = ops.mrope_cos_sin(batch.mrope, cfg.rotary_dim, cfg.rope_theta,
                                         cfg.mrope_section)
        else:
            cos, sin = ops.rotary_cos_sin(batch.positions, cfg.rotary_dim, cfg.rope_theta)
        return cls(batch, state, cos, sin)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps
        self.offset = offset  # 1.0: weights are stored zero-centred (Qwen3.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps, self.offset)


_FEW_ROWS = 256        # steps of up to this many tokens multiply by the packed weight
_PACK_MIN = 1 << 18    # weights of fewer elements stay plain (a oneDNN call's own cost)


class Matmul:
    """x @ weight.T (+ bias) for a weight [out, in].

    On an fp32 CPU it also keeps oneDNN's packed (blocked) copy of a large weight for
    steps of a few tokens, where MKL on the plain weight is slow. From a few hundred
    tokens MKL is as fast or faster, so long steps keep it; and a small weight stays
    plain, since a oneDNN call costs more than MKL takes on it (docs/BENCHMARKS.md,
    Measurements behind the code). The copy costs the weight's memory once more."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight, bias
        self.packed = _pack(weight) if weight.numel() >= _PACK_MIN else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.dim() == 2 and x.shape[0] <= _FEW_ROWS:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias,
                                                      "none", [], "")
        return F.linear(x, self.weight, self.bias)


def _pack(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's packed copy of an fp32 CPU weight; None where it does not apply."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 \
            or not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 16)
    except (AttributeError, RuntimeError, NotImplementedError):   # a torch built without it
        return None


def fuse_linears(linears: list[nn.Linear]) -> Matmul:
    """One weight (and bias) for linears that read the same input: their outputs side by
    side. Each linear's parameters become views of it, so they keep their names (and
    state_dict) without a second copy. One matmul instead of several: the weights
    stream once, in one call (a 14-token step: ~25% less matmul time on the CPU).
    Weights kept in their GGUF formats fuse by format (model/quant.py)."""
    if any(isinstance(m, KeptLinear) for m in linears):
        return fuse_kept(linears)
    weight = torch.cat([m.weight.detach() for m in linears])
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
    return Matmul(weight, bias)


def matmul_of(linear: nn.Linear) -> Matmul:
    if isinstance(linear, KeptLinear):
        return fuse_kept([linear])
    bias = None if linear.bias is None else linear.bias.detach()
    return Matmul(linear.weight.detach(), bias)


def fuse_kept(linears: list[nn.Module]) -> KeptMatmul:
    """One KeptMatmul for linears (some kept) that read the same input."""
    parts: list = []
    run: list[KeptLinear] = []

    def flush() -> None:
        if not run:
            return
        if len(run) == 1:
            parts.append(run[0].qweight)
            run.clear()
            return
        fused = cat_rows([m.qweight for m in run])
        row = 0
        for m in run:     # views of the fused rows: no second copy stays
            n = m.out_features
            m.qweight = QuantTensor(fused.data[row:row + n], fused.fmt, (n, fused.shape[1]))
            row += n
        parts.append(fused)
        run.clear()

    for m in linears:
        if isinstance(m, KeptLinear) and m.in_index is None and \
                (not run or run[0].qweight.fmt == m.qweight.fmt):
            run.append(m)
            continue
        flush()
        if isinstance(m, KeptLinear) and m.in_index is None:
            run.append(m)
        elif isinstance(m, KeptLinear):
            parts.append(m.matmul)          # permutes its own input
        else:
            parts.append(Matmul(m.weight.detach()))
    flush()
    biases = [m.bias for m in linears]
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    return KeptMatmul(parts, bias)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.gate_up: Matmul | None = None   # fuse(): [gate; up]
        self.down: Matmul | None = None

    def fuse(self) -> None:
        self.gate_up = fuse_linears([self.gate_proj, self.up_proj])
        self.down = matmul_of(self.down_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None:
            return self.down_proj(ops.silu_and_mul(self.gate_proj(x), self.up_proj(x)))
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(ops.silu_and_mul(gate, up))


class Attention(nn.Module):
    """Causal GQA attention over paged KV.

    llama: plain. Qwen3.5 (`gated`): q_proj also yields a per-head output gate,
    q and k get a zero-centred RMSNorm, and only a part of each head is rotated.
    Gemma 3: q and k normed (`qk_norm`) without a gate; a local layer sees `window` keys
    and rotates by the context's `local` rotary. gpt-oss: `sinks`, a learned logit per
    query head in the softmax's denominator.
    """

    def __init__(self, cfg: ModelConfig, attn_index: int, gated: bool,
                 qk_norm: bool | None = None, window: int = 0, local_rotary: bool = False,
                 sinks: bool = False) -> None:
        super().__init__()
        self.attn_index = attn_index
        self.gated = gated
        self.qk_norm = gated if qk_norm is None else qk_norm
        self.window = window
        self.local_rotary = local_rotary
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d * (2 if gated else 1), bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=bias)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=bias)
        if self.qk_norm:
            self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps, offset=1.0)
            self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps, offset=1.0)
        self.has_sinks = sinks
        if sinks:
            self.sinks = nn.Parameter(torch.empty(self.h))
        self.scale = self.d ** -0.5
        self.qkv: Matmul | None = None     # fuse(): [q; k; v]
        self.out: Matmul | None = None

    def fuse(self) -> None:
        self.qkv = fuse_linears([self.q_proj, self.k_proj, self.v_proj])
        self.out = matmul_of(self.o_proj)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        kv = self.hkv * self.d
        return self.qkv(x).split([self.q_proj.out_features, kv, kv], dim=-1)

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
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = ctx.local if self.local_rotary else (ctx.cos, ctx.sin)
        q = ops.apply_rotary(q, cos, sin)
        k = ops.apply_rotary(k, cos, sin)
        # a window layer's KV is in the window pool, at its pages' rooms (model/state.py);
        # a batch without rooms (a caller owning its pages: model/testing.py) uses page ids
        kv, layer = ctx.state.where[self.attn_index]
        rows = ctx.batch
        if kv is ctx.state.kv_win and ctx.batch.window is not None:
            rows = ctx.batch.window
        ops.write_kv(kv, layer, rows.kv_index, k, v)
        out = ops.step_attention(q, kv, layer, rows.varlen, self.scale,
                                 self.window, self.sinks if self.has_sinks else None)
        out = out.reshape(N, self.h * self.d)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out) if self.out is None else self.out(out)

"""Selective state space mixers over per-sequence state cells: Mamba2 (Nemotron-H,
Granite-4.0-H, Falcon-H1, Mamba2) and Mamba v1 as Jamba has it.

A sequence's state for recurrent layer r is state.conv[cell, r] [conv_dim, K-1] (the
causal conv's last inputs) and state.ssm[cell, r] fp32: [heads, head_dim, state_size]
for Mamba2, [1, d_inner, state_size] for Mamba. A step reads it as the initial state
and writes the final state back in place, one kernel call per layer for all the
step's sequences (kernels/varlen.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ckptd.kernels import ops
from ckptd.model.arch.layers import Matmul, RMSNorm, StepContext, matmul_of
from ckptd.model.quant import KeptLinear
from ckptd.model.ssm_config import SSMConfig


def _project(linear: nn.Linear, fused: Matmul | None, x: torch.Tensor) -> torch.Tensor:
    return linear(x) if fused is None else fused(x)


class GroupGatedNorm(nn.Module):
    """Mamba2's gated RMSNorm over groups of the inner dim (transformers'
    MambaRMSNormGated): norm(y * silu(z)) per group, times the weight; Falcon-H1 may
    normalise first and gate after (norm_before_gate)."""

    def __init__(self, dim: int, groups: int, eps: float, before_gate: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.groups, self.eps, self.before_gate = groups, eps, before_gate

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        T = y.shape[0]
        h = y.float()
        if not self.before_gate:
            h = h * F.silu(z.float())
        h = h.view(T, self.groups, -1)
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).view(T, -1)
        h = self.weight.float() * h
        if self.before_gate:
            h = h * F.silu(z.float())
        return h.to(y.dtype)


class Mamba2Mixer(nn.Module):
    """in_proj -> z (gate), xBC (conv, silu), dt; the scan over x with B, C of the
    head's group (kernels/mamba2); the gated norm; out_proj."""

    def __init__(self, cfg: SSMConfig, rec_index: int) -> None:
        super().__init__()
        self.rec_index = rec_index
        self.H, self.P = cfg.ssm_heads, cfg.ssm_head_dim
        self.G, self.N = cfg.ssm_groups, cfg.ssm_state_size
        self.inner = self.H * self.P
        self.conv_dim = self.inner + 2 * self.G * self.N
        self.dt_limit = cfg.ssm_dt_limit
        self.in_proj = nn.Linear(cfg.hidden_size, self.inner + self.conv_dim + self.H,
                                 bias=cfg.ssm_in_bias)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.ssm_conv_kernel,
                                groups=self.conv_dim, bias=cfg.ssm_conv_bias)
        self.dt_bias = nn.Parameter(torch.empty(self.H))
        self.A_log = nn.Parameter(torch.empty(self.H))
        self.D = nn.Parameter(torch.empty(self.H))
        self.norm = GroupGatedNorm(self.inner, self.G, cfg.ssm_eps, cfg.ssm_norm_before_gate) \
            if cfg.ssm_norm else None
        self.out_proj = nn.Linear(self.inner, cfg.hidden_size, bias=cfg.ssm_out_bias)
        self.inp: Matmul | None = None
        self.out: Matmul | None = None

    def fuse(self) -> None:
        self.inp, self.out = matmul_of(self.in_proj), matmul_of(self.out_proj)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        T = x.shape[0]
        z, xbc, dt = _project(self.in_proj, self.inp, x).split(
            [self.inner, self.conv_dim, self.H], dim=-1)
        r = self.rec_index
        xbc = ops.step_conv1d(xbc, self.conv1d.weight[:, 0, :], ctx.state.conv[:, r],
                              ctx.batch.varlen, self.conv1d.bias)
        xs, B, C = xbc.split([self.inner, self.G * self.N, self.G * self.N], dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(*self.dt_limit)
        y = ops.step_mamba2(xs.view(T, self.H, self.P), dt, -torch.exp(self.A_log.float()),
                            B.view(T, self.G, self.N), C.view(T, self.G, self.N),
                            self.D.float(), ctx.state.ssm[:, r], ctx.batch.varlen)
        y = y.reshape(T, self.inner)
        y = (y.float() * F.silu(z.float())).to(y.dtype) if self.norm is None else self.norm(y, z)
        return _project(self.out_proj, self.out, y)


class MambaMixer(nn.Module):
    """Mamba (v1) as Jamba has it: in_proj -> x (conv, silu), z (gate); x_proj -> the
    time step's low rank, B, C, each RMS-normalised; dt_proj; the selective scan
    (kernels/mamba1); y * silu(z); out_proj."""

    def __init__(self, cfg: SSMConfig, rec_index: int) -> None:
        super().__init__()
        self.rec_index = rec_index
        self.inner, self.N, self.R = cfg.ssm_inner, cfg.ssm_state_size, cfg.ssm_dt_rank
        H, eps = cfg.hidden_size, cfg.ssm_eps
        self.in_proj = nn.Linear(H, 2 * self.inner, bias=cfg.ssm_in_bias)
        self.conv1d = nn.Conv1d(self.inner, self.inner, cfg.ssm_conv_kernel, groups=self.inner,
                                bias=cfg.ssm_conv_bias)
        self.x_proj = nn.Linear(self.inner, self.R + 2 * self.N, bias=False)
        self.dt_proj = nn.Linear(self.R, self.inner, bias=True)
        self.A_log = nn.Parameter(torch.empty(self.inner, self.N))
        self.D = nn.Parameter(torch.empty(self.inner))
        self.out_proj = nn.Linear(self.inner, H, bias=cfg.ssm_out_bias)
        self.dt_layernorm = RMSNorm(self.R, eps)
        self.b_layernorm = RMSNorm(self.N, eps)
        self.c_layernorm = RMSNorm(self.N, eps)
        self.inp: Matmul | None = None
        self.out: Matmul | None = None

    def fuse(self) -> None:
        self.inp, self.out = matmul_of(self.in_proj), matmul_of(self.out_proj)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        xs, z = _project(self.in_proj, self.inp, x).chunk(2, dim=-1)
        r = self.rec_index
        xs = ops.step_conv1d(xs, self.conv1d.weight[:, 0, :], ctx.state.conv[:, r],
                             ctx.batch.varlen, self.conv1d.bias)
        rank, B, C = self.x_proj(xs).split([self.R, self.N, self.N], dim=-1)
        rank, B, C = self.dt_layernorm(rank), self.b_layernorm(B), self.c_layernorm(C)
        # transformers adds the bias in fp32, inside the scan
        lin = self.dt_proj
        dt = lin.matmul(rank) if isinstance(lin, KeptLinear) else F.linear(rank, lin.weight)
        dt = F.softplus(dt.float() + lin.bias.float())
        y = ops.step_mamba1(xs, dt, -torch.exp(self.A_log.float()), B, C, self.D.float(),
                            ctx.state.ssm[:, r, 0], ctx.batch.varlen)
        y = (y.float() * F.silu(z.float())).to(y.dtype)
        return _project(self.out_proj, self.out, y)

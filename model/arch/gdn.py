"""Gated DeltaNet mixer (Qwen3.5 `linear_attn`) over per-sequence state cells.

A sequence's recurrent state is state.conv[cell, r] [conv_dim, K-1] and
state.ssm[cell, r] [v_heads, k_dim, v_dim] (fp32) for recurrent layer r; a step
reads it as the initial state and writes the final state back in place.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from ckptd.kernels import ops
from ckptd.model.arch.layers import Matmul, StepContext, fuse_linears, matmul_of
from ckptd.model.config import ModelConfig

# CKPTD_GDN=recurrent forces the step-by-step reference in prefill (for tests).
_FORCE_RECURRENT = os.environ.get("CKPTD_GDN") == "recurrent"


class GatedRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return ops.gated_rms_norm(x, z, self.weight, self.eps)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ModelConfig, rec_index: int) -> None:
        super().__init__()
        self.rec_index = rec_index
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = self.hk * self.dk, self.hv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        K = cfg.linear_conv_kernel
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, K, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(self.hv))
        self.A_log = nn.Parameter(torch.empty(self.hv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, cfg.hidden_size, bias=False)
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, self.hv, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, self.hv, bias=False)
        self.in_proj: Matmul | None = None     # fuse(): [qkv; z; b; a]
        self.out: Matmul | None = None

    def fuse(self) -> None:
        self.in_proj = fuse_linears([self.in_proj_qkv, self.in_proj_z, self.in_proj_b,
                                     self.in_proj_a])
        self.out = matmul_of(self.out_proj)

    def _project(self, x: torch.Tensor):
        if self.in_proj is None:
            return self.in_proj_qkv(x), self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)
        return self.in_proj(x).split(
            [self.conv_dim, self.value_dim, self.hv, self.hv], dim=-1)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        N = x.shape[0]
        qkv, z, b, a = self._project(x)          # [N, conv_dim], [N, value_dim], [N, hv] x 2
        beta = b.float().sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        weight = self.conv1d.weight[:, 0, :]                        # [conv_dim, K]
        r = self.rec_index
        varlen = ctx.batch.varlen
        # one call per layer for the whole step: every sequence's conv and delta-rule
        # state is read from its cell and written back there, in place
        y = ops.step_conv1d(qkv, weight, ctx.state.conv[:, r], varlen)
        q, k, v = self._split(y)
        out = ops.step_gated_delta(q, k, v, g, beta, ctx.state.ssm[:, r], varlen,
                                   recurrent=_FORCE_RECURRENT)
        out = self.norm(out.reshape(N * self.hv, self.dv), z.reshape(N * self.hv, self.dv))
        out = out.reshape(N, self.value_dim)
        return self.out_proj(out) if self.out is None else self.out(out)

    def _split(self, y: torch.Tensor):
        """Conv output [T, conv_dim] -> l2-normalized q, k [T, hv, dk] (key heads repeated
        for their value heads) and v [T, hv, dv]."""
        T = y.shape[0]
        q, k, v = y.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = ops.l2norm(q.reshape(T, self.hk, self.dk))
        k = ops.l2norm(k.reshape(T, self.hk, self.dk))
        if self.hv != self.hk:
            q = q.repeat_interleave(self.hv // self.hk, dim=1)
            k = k.repeat_interleave(self.hv // self.hk, dim=1)
        return q, k, v.reshape(T, self.hv, self.dv)

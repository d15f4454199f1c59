"""The decoder of the selective state space hybrids (model/ssm_config.py): Nemotron-H,
Granite-4.0-H, Falcon-H1, Mamba2 and Jamba, in one layer layout.

A layer is two residual parts, either of which a family may leave out:
    x = x + r * mixer(input_layernorm(x))           mamba | self_attn | both (parallel)
    x = x + r * mlp(post_attention_layernorm(x))    dense | relu2 | MoE, + Granite's shared
with r the residual multiplier (Granite). The checkpoints' own names are mapped onto
these by model/ssm_checkpoint.py; attention is arch/layers.py's, without rotary where a
family has no position embedding (Nemotron-H, Jamba, Granite-4.0-H).
"""

from __future__ import annotations

import torch
from torch import nn

from ckptd.model.arch.decoder import CausalLM
from ckptd.model.arch.layers import MLP, Attention, Matmul, RMSNorm, StepContext, matmul_of
from ckptd.model.arch.mamba import Mamba2Mixer, MambaMixer
from ckptd.model.arch.moe import SparseMoE
from ckptd.model.batch import StepBatch
from ckptd.model.ssm_config import SSMConfig
from ckptd.model.state import DeviceState


class Relu2MLP(nn.Module):
    """Nemotron-H's MLP: down(relu(up(x))^2)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool) -> None:
        super().__init__()
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.up: Matmul | None = None
        self.down: Matmul | None = None

    def fuse(self) -> None:
        self.up, self.down = matmul_of(self.up_proj), matmul_of(self.down_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up_proj(x) if self.up is None else self.up(x)
        h = torch.relu(h).square()
        return self.down_proj(h) if self.down is None else self.down(h)


def _mlp(cfg: SSMConfig, kind: str) -> nn.Module:
    if kind == "moe":
        return SparseMoE(cfg)
    if cfg.mlp_act == "relu2":
        return Relu2MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
    return MLP(cfg.hidden_size, cfg.intermediate_size)


class SSMLayer(nn.Module):
    def __init__(self, cfg: SSMConfig, layer: int, attn_index: int, rec_index: int) -> None:
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        mixer, mlp = cfg.layer_types[layer], cfg.mlp_types[layer]
        self.residual = cfg.residual_multiplier
        self.mamba: nn.Module | None = None
        self.self_attn: Attention | None = None
        self.mlp: nn.Module | None = None
        self.shared_mlp: MLP | None = None
        if mixer != "none":
            self.input_layernorm = RMSNorm(H, eps)
        if mixer in ("mamba2", "parallel"):
            self.mamba = Mamba2Mixer(cfg, rec_index)
        elif mixer == "mamba":
            self.mamba = MambaMixer(cfg, rec_index)
        if mixer in ("full_attention", "parallel"):
            self.self_attn = Attention(cfg, attn_index, gated=False)
            if cfg.attention_scale:
                self.self_attn.scale = cfg.attention_scale
        if mlp != "none" or cfg.shared_mlp_size:
            self.post_attention_layernorm = RMSNorm(H, eps)
        if mlp != "none":
            self.mlp = _mlp(cfg, mlp)
        if cfg.shared_mlp_size:
            self.shared_mlp = MLP(H, cfg.shared_mlp_size)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        if self.mamba is not None or self.self_attn is not None:
            h = self.input_layernorm(x)
            parts = [m(h, ctx) for m in (self.mamba, self.self_attn) if m is not None]
            x = self._add(x, parts[0] if len(parts) == 1 else parts[0] + parts[1])
        if self.mlp is not None or self.shared_mlp is not None:
            h = self.post_attention_layernorm(x)
            parts = [m(h) for m in (self.mlp, self.shared_mlp) if m is not None]
            x = self._add(x, parts[0] if len(parts) == 1 else parts[0] + parts[1])
        return x

    def _add(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return x + (out if self.residual == 1.0 else out * self.residual)


class SSMModel(nn.Module):
    def __init__(self, cfg: SSMConfig) -> None:
        super().__init__()
        # given a weight, nn.Embedding skips its init (see arch/decoder.py)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        layers, n_attn, n_rec = [], 0, 0
        for i, kind in enumerate(cfg.layer_types):
            layers.append(SSMLayer(cfg, i, n_attn, n_rec))
            n_attn += kind in ("full_attention", "parallel")
            n_rec += kind in ("mamba2", "mamba", "parallel")
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class HybridLM(CausalLM):
    """forward(batch, state) -> float32 logits [M, vocab] for batch.logits_index."""

    def body(self, cfg: SSMConfig) -> nn.Module:
        return SSMModel(cfg)

    @torch.inference_mode()
    def forward(self, batch: StepBatch, state: DeviceState) -> torch.Tensor:
        cfg = self.config
        ctx = StepContext.build(batch, state, cfg)
        x = self.model.embed_tokens(batch.input_ids)
        if cfg.embedding_multiplier != 1.0:
            x = x * cfg.embedding_multiplier
        for layer in self.model.layers:
            x = layer(x, ctx)
        x = self.model.norm(x[batch.logits_index])
        logits = (self.lm_head(x) if self.head is None else self.head(x)).float()
        return logits if cfg.logits_multiplier == 1.0 else logits * cfg.logits_multiplier

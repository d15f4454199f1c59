"""Gemma 3's text decoder (model/gemma_config.py): local (sliding window) and global
attention layers, four norms a layer, GELU MLP, scaled embeddings, soft-capped logits.

    x = embed(ids) * sqrt(hidden)          (the scale rounded to the model's dtype)
    x = x + post_attention_layernorm(self_attn(input_layernorm(x)))
    x = x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))
    logits = cap * tanh(lm_head(norm(x)) / cap)

Every norm is zero-centred (x / rms(x) * (1 + w), in fp32), q and k too. A local layer's
query sees the window's keys and rotates by rope_local_theta; a global layer's sees all
and rotates by rope_theta (positions divided by rope_factor). Checkpoint names are
transformers' own, so no renaming is needed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ckptd.kernels import ops
from ckptd.model.arch.decoder import CausalLM
from ckptd.model.arch.layers import MLP, Attention, RMSNorm, StepContext
from ckptd.model.batch import StepBatch
from ckptd.model.gemma_config import GemmaConfig
from ckptd.model.state import DeviceState


class GeluMLP(MLP):
    """down(gelu_tanh(gate(x)) * up(x))."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
        h = F.gelu(gate, approximate="tanh") * up
        return self.down_proj(h) if self.down is None else self.down(h)


class GemmaLayer(nn.Module):
    def __init__(self, cfg: GemmaConfig, layer: int) -> None:
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.local = cfg.layer_types[layer] == "sliding_attention"
        self.self_attn = Attention(cfg, layer, gated=False, qk_norm=True,
                                   window=cfg.window(layer), local_rotary=self.local)
        self.self_attn.scale = cfg.query_pre_attn_scalar ** -0.5
        self.mlp = GeluMLP(H, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(H, eps, offset=1.0)
        self.post_attention_layernorm = RMSNorm(H, eps, offset=1.0)
        self.pre_feedforward_layernorm = RMSNorm(H, eps, offset=1.0)
        self.post_feedforward_layernorm = RMSNorm(H, eps, offset=1.0)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), ctx))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class GemmaModel(nn.Module):
    def __init__(self, cfg: GemmaConfig) -> None:
        super().__init__()
        # given a weight, nn.Embedding skips its init (see arch/decoder.py)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(GemmaLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset=1.0)


class GemmaLM(CausalLM):
    """forward(batch, state) -> float32 logits [M, vocab] for batch.logits_index."""

    def __init__(self, cfg: GemmaConfig) -> None:
        super().__init__(cfg)
        self.embed_scale = cfg.hidden_size ** 0.5       # fuse() rounds it to the dtype

    def body(self, cfg: GemmaConfig) -> nn.Module:
        return GemmaModel(cfg)

    def fuse(self) -> None:
        super().fuse()
        # transformers multiplies by sqrt(hidden) as a tensor of the model's dtype: the
        # same number, rounded once here (a Python float: no tensor made in the forward)
        self.embed_scale = torch.tensor(self.config.hidden_size ** 0.5, dtype=self.dtype,
                                        device="cpu").item()

    @torch.inference_mode()
    def forward(self, batch: StepBatch, state: DeviceState) -> torch.Tensor:
        cfg = self.config
        positions = batch.positions.float() / cfg.rope_factor
        cos, sin = ops.rotary_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        local = ops.rotary_cos_sin(batch.positions, cfg.head_dim, cfg.rope_local_theta)
        ctx = StepContext(batch, state, cos, sin, local)
        x = self.model.embed_tokens(batch.input_ids) * self.embed_scale
        for layer in self.model.layers:
            x = layer(x, ctx)
        x = self.model.norm(x[batch.logits_index])
        logits = (self.lm_head(x) if self.head is None else self.head(x)).float()
        cap = cfg.final_logit_softcapping
        return logits if not cap else torch.tanh(logits / cap) * cap

"""The decoder stack for every architecture: llama and the Qwen3.5 / Qwen3-Next
hybrids, dense or with a mixture of experts.

Reads top to bottom: DecoderLayer -> Model -> CausalLM. A layer's mixer is
paged attention (`full_attention`) or Gated DeltaNet (`linear_attention`); its MLP
is dense or a sparse mixture of experts (`moe`, arch/moe.py). Qwen3-Next's own
projection layout is turned into Qwen3.5's by the loader (model/checkpoint.py), so
one module serves both.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from ckptd.model.arch import decode_cpu
from ckptd.model.arch.gdn import GatedDeltaNet
from ckptd.model.arch.layers import MLP, Attention, Matmul, RMSNorm, StepContext, matmul_of
from ckptd.model.arch.moe import SparseMoE
from ckptd.model.batch import StepBatch
from ckptd.model.config import ModelConfig
from ckptd.model.spec import StateSpec
from ckptd.model.state import DeviceState


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, index_of_kind: int) -> None:
        super().__init__()
        offset = 1.0 if cfg.qwen else 0.0
        self.kind = kind = cfg.layer_types[layer]
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg, index_of_kind)
        else:
            self.self_attn = Attention(cfg, index_of_kind, gated=cfg.qwen)
        self.mlp = SparseMoE(cfg) if cfg.mlp_types[layer] == "moe" \
            else MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset)

    def forward(self, x: torch.Tensor, ctx: StepContext,
                decode: decode_cpu.DecodeStep | None = None) -> torch.Tensor:
        """decode: a CPU decode step's shared arguments, where its fused path applies
        (model/arch/decode_cpu.py); a plain attention layer then takes it, and updates
        the residual stream x in place."""
        if decode is not None and self.kind == "full_attention" \
                and decode_cpu.applies(self.self_attn):
            return decode_cpu.decoder_layer(self, x, decode)
        mixer = self.linear_attn if self.kind == "linear_attention" else self.self_attn
        x = x + mixer(self.input_layernorm(x), ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # given a weight, nn.Embedding skips its normal_() init, which on the meta device
        # imports torch._dynamo: ~1.2 s and ~200 MB of RSS at every model load
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        counts = {"full_attention": 0, "linear_attention": 0}
        layers = []
        for i, kind in enumerate(cfg.layer_types):
            layers.append(DecoderLayer(cfg, i, counts[kind]))
            counts[kind] += 1
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, 1.0 if cfg.qwen else 0.0)


class CausalLM(nn.Module):
    """forward(batch, state) -> float32 logits [M, vocab] for batch.logits_index."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = self.body(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.fingerprint = ""  # set by the loader
        # the attention layers' KV dtype where it is not the compute dtype (loader.py:
        # use_kv_dtype); the state spec, and so every cache tier, carries it
        self.kv_dtype: torch.dtype | None = None
        self.head: Matmul | None = None
        self.lora = None       # model/lora/apply.py: Lora, once adapters are attached

    def body(self, cfg: ModelConfig) -> nn.Module:
        """The decoder stack: embed_tokens, layers, norm (arch/ssm_lm.py has another)."""
        return Model(cfg)

    def fuse(self) -> None:
        """Fuse the projections that share an input into one matmul each; on an fp32 CPU
        each matmul also packs its weight for steps of a few tokens (layers.py: Matmul)."""
        for m in self.modules():
            if m is not self and hasattr(m, "fuse"):
                m.fuse()
        self.head = matmul_of(self.lm_head)
        if self.lora is not None:
            self.lora.wrap(self)

    def _apply(self, fn, recurse=True):
        # .to(dtype / device) converts the parameters; the fused weights are plain
        # attributes, so fuse again from the converted ones (and lay them out anew)
        out = super()._apply(fn, recurse)
        self.fuse()
        return out

    # the final norm: the embedding may be kept in a GGUF format (model/quant.py)
    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    def state_spec(self, block_size: int) -> StateSpec:
        spec = self.config.state_spec(block_size, self.dtype)
        if self.kv_dtype is None or spec.attention is None:
            return spec
        return replace(spec, attention=replace(spec.attention, dtype=self.kv_dtype))

    @torch.inference_mode()
    def forward(self, batch: StepBatch, state: DeviceState) -> torch.Tensor:
        ctx = StepContext.build(batch, state, self.config)
        if self.lora is not None:
            self.lora.rows = batch.lora
        x = self.model.embed_tokens(batch.input_ids)
        if batch.images is not None:      # image placeholders: the vision encoder's rows
            x = x.index_copy(0, batch.images.index, batch.images.values.to(x.dtype))
        decode = decode_cpu.DecodeStep.build(batch, x, state.kv, ctx.cos, ctx.sin)
        for layer in self.model.layers:
            x = layer(x, ctx, decode)
        x = self.model.norm(x[batch.logits_index])
        if self.lora is not None and batch.lora is not None:
            self.lora.rows = batch.lora.at(batch.logits_index)
        return (self.lm_head(x) if self.head is None else self.head(x)).float()

"""gpt-oss' decoder (model/gpt_oss_config.py): attention layers alternating a 128-key
window and full attention, each with sinks; a mixture of experts in every layer.

    x = x + self_attn(input_layernorm(x))        q, k, v, o biased; sinks [heads]
    x = x + mlp(post_attention_layernorm(x))
    router logits = router(x) (biased); top-k; softmax over the k picked logits
    expert(x) = down(clamped_swiglu(gate(x), up(x))) with biases (kernels/moe/naive.py)

The rotary is YaRN's (GptOssConfig.rotary), cos and sin scaled by its attention factor.
The experts are kept as the other MoE models keep them: gate_up_proj [E, 2I, H] (gate
rows, then up rows), down_proj [E, H, I], with gate_up_proj_bias [E, 2I] and
down_proj_bias [E, H]. transformers stores gate_up_proj [E, H, 2I] with gate and up
interleaved and down_proj [E, I, H]: `from_hf_layout` turns its tensors into these.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ckptd.kernels import ops
from ckptd.model.arch.decoder import CausalLM
from ckptd.model.arch.layers import Attention, RMSNorm, StepContext
from ckptd.model.batch import StepBatch
from ckptd.model.checkpoint import Recipe
from ckptd.model.gpt_oss_config import GptOssConfig
from ckptd.model.state import DeviceState


class Experts(nn.Module):
    def __init__(self, n_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * intermediate, hidden))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(n_experts, 2 * intermediate))
        self.down_proj = nn.Parameter(torch.empty(n_experts, hidden, intermediate))
        self.down_proj_bias = nn.Parameter(torch.empty(n_experts, hidden))


class GptOssMoE(nn.Module):
    def __init__(self, cfg: GptOssConfig) -> None:
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.alpha, self.limit = cfg.swiglu_alpha, cfg.swiglu_limit
        self.router = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=True)
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_ids [N, k], topk_weights [N, k]): the k largest logits, softmaxed among
        themselves in their own dtype, as transformers' GptOssTopKRouter."""
        # the router keeps its own matmul (no fusing): a near-tie must pick as transformers
        logits = F.linear(x, self.router.weight, self.router.bias)
        values, ids = torch.topk(logits, self.top_k, dim=-1)
        return ids, F.softmax(values, dim=-1, dtype=values.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = self.route(x)
        e = self.experts
        return ops.moe_experts_clamped(x, ids, weights, e.gate_up_proj, e.gate_up_proj_bias,
                                       e.down_proj, e.down_proj_bias, self.alpha, self.limit)


class GptOssLayer(nn.Module):
    def __init__(self, cfg: GptOssConfig, layer: int) -> None:
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Attention(cfg, layer, gated=False, qk_norm=False,
                                   window=cfg.window(layer), sinks=True)
        self.mlp = GptOssMoE(cfg)
        self.input_layernorm = RMSNorm(H, eps)
        self.post_attention_layernorm = RMSNorm(H, eps)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


class GptOssModel(nn.Module):
    def __init__(self, cfg: GptOssConfig) -> None:
        super().__init__()
        # given a weight, nn.Embedding skips its init (see arch/decoder.py)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(GptOssLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class GptOssLM(CausalLM):
    """forward(batch, state) -> float32 logits [M, vocab] for batch.logits_index."""

    def __init__(self, cfg: GptOssConfig) -> None:
        super().__init__(cfg)
        # the model is built on the meta device: the frequencies are made on the CPU and
        # copied once per device the model runs on (before any CUDA graph is captured)
        self._rotary: dict[torch.device, tuple[torch.Tensor, float]] = {}

    def body(self, cfg: GptOssConfig) -> nn.Module:
        return GptOssModel(cfg)

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dev = positions.device
        if dev not in self._rotary:
            inv_freq, factor = self.config.rotary()
            self._rotary[dev] = (inv_freq.to(dev), factor)
        inv_freq, factor = self._rotary[dev]
        freqs = positions.float()[:, None] * inv_freq[None]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos() * factor, emb.sin() * factor

    @torch.inference_mode()
    def forward(self, batch: StepBatch, state: DeviceState) -> torch.Tensor:
        cos, sin = self._cos_sin(batch.positions)
        ctx = StepContext(batch, state, cos, sin)
        x = self.model.embed_tokens(batch.input_ids)
        for layer in self.model.layers:
            x = layer(x, ctx)
        x = self.model.norm(x[batch.logits_index])
        return (self.lm_head(x) if self.head is None else self.head(x)).float()


def from_hf_layout(cfg: GptOssConfig, recipes: dict[str, Recipe]) -> dict[str, Recipe]:
    """A transformers gpt_oss folder's expert tensors in the model's layout (see the
    module docstring); ValueError naming MXFP4 tensors (the Hub's `*_blocks` and
    `*_scales`), which are not dequantized here."""
    packed = [n for n in recipes if n.endswith(("_blocks", "_scales"))]
    if packed:
        raise ValueError(f"checkpoint tensor {packed[0]} is MXFP4 (the Hub's packed expert "
                         "format), which is not supported: use a dequantized (bf16) gpt-oss "
                         "checkpoint")
    out = dict(recipes)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}.mlp.experts."
        if p + "gate_up_proj" in out:
            out[p + "gate_up_proj"] = _recipe(out[p + "gate_up_proj"], _split_gate_up_weight)
        if p + "gate_up_proj_bias" in out:
            out[p + "gate_up_proj_bias"] = _recipe(out[p + "gate_up_proj_bias"],
                                                   _split_gate_up_bias)
        if p + "down_proj" in out:
            out[p + "down_proj"] = _recipe(out[p + "down_proj"],
                                           lambda t: t.transpose(-1, -2).contiguous())
    return out


def _recipe(src: Recipe, change) -> Recipe:
    return lambda dtype, device: change(src(dtype, device))


def _split_gate_up_weight(t: torch.Tensor) -> torch.Tensor:
    """[E, H, 2I] with gate and up interleaved -> [E, 2I, H]: gate rows, then up rows."""
    t = t.transpose(-1, -2)
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1)


def _split_gate_up_bias(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=-1)

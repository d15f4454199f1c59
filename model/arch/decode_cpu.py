"""A decode step's attention layers on the CPU, in a few calls each.

When every sequence of a step decodes one token, on the CPU in fp32 with a head-major
KV pool (kernels/paged_attention/layout.py; fp32 or fp16 KV), a llama-style layer
(attention without a gate, q/k norm, window or sinks) runs as: the input RMSNorm (one
C call); the fused q/k/v matmul; one C call that rotates q and k, writes k and v into the pages and
attends (kernels/paged_attention/cpu.c, ckpa_decode_step); the output matmul; the
residual add with the next RMSNorm (one C call); the gate/up matmul, SwiGLU (one C
call), the down matmul and the residual add. The torch path takes ~130 small ops a
layer for the same (norms, rotary, the KV write's index arithmetic, views, chunks), and
their per-op cost was most of a short-context step (docs/BENCHMARKS.md, "Decode step
on the CPU"). What every layer shares (the page tables, lengths, KV rows and rotary of
the step) is made once per step, in `DecodeStep.build`.

Prefill, mixed steps, GPUs and every other layer keep the torch path, which
tests/model/test_decode_cpu.py holds this one to (fp32, within 1e-5).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ckptd.kernels import dispatch
from ckptd.kernels.norm import cpu as norm_cpu
from ckptd.kernels.paged_attention import cpu as attn_cpu
from ckptd.kernels.paged_attention import layout
from ckptd.model.arch.layers import MLP, Attention
from ckptd.model.batch import StepBatch

_F32 = torch.float32
# by name: under a meta default device a bare torch.empty hands the C code a null pointer
_CPU = torch.device("cpu")


@dataclass
class DecodeStep:
    """A decode step's shared arguments, as the C calls read them, and the buffers its
    layers reuse (each layer's values are used up before the next layer writes them)."""
    memory: torch.Tensor     # the KV pool, head-major [n_attn, 2, Hkv, P * B, D]
    cos: torch.Tensor        # fp32 [N, rotary_dim], contiguous
    sin: torch.Tensor
    kv_index: torch.Tensor   # int64 [N]: each new token's row (page * B + offset)
    tables: torch.Tensor     # int32 [N, W]: each sequence's pages, zero-padded
    lens: torch.Tensor       # int32 [N]: keys each token sees (its own included)
    block_size: int
    splits: int              # runs of pages per (sequence, kv head)
    buffers: dict = field(default_factory=dict)

    @classmethod
    def build(cls, batch: StepBatch, x: torch.Tensor, kv: torch.Tensor | None,
              cos: torch.Tensor, sin: torch.Tensor) -> DecodeStep | None:
        """The step's arguments for the residual stream x, or None where this path does
        not apply."""
        varlen = batch.varlen
        if (not varlen.decode_only or batch.mrope is not None or kv is None
                or kv.device.type != "cpu" or not attn_cpu.reads(kv.dtype)
                or kv.shape[-1] > attn_cpu.MAX_HEAD_DIM or cos.dtype != _F32
                or x.dtype != _F32 or not x.is_contiguous()
                or dispatch.MODE == "torch" or dispatch.use_triton(kv)):
            return None
        memory = layout.head_major(kv)
        B = kv.shape[3]
        if memory is None or B > attn_cpu.MAX_BLOCK or not norm_cpu.available():
            return None
        lens = [c + 1 for c in varlen.ctx]
        if any(len(t) * B < n for t, n in zip(varlen.tables, lens)):
            raise ValueError("a decode step's page table is shorter than its sequence")
        splits = attn_cpu.decode_splits(varlen.n, max(lens), memory.shape[2], B,
                                        torch.get_num_threads())
        return cls(memory, cos.contiguous(), sin.contiguous(), batch.kv_index.contiguous(),
                   varlen.page_tables.contiguous(),
                   torch.tensor(lens, dtype=torch.int32, device=_CPU), B, splits)

    def buffer(self, name: str, *shape: int) -> torch.Tensor:
        """An fp32 tensor of `shape` for `name`, the same one for every layer that asks."""
        buf = self.buffers.get(name)
        if buf is None or buf.shape != shape:
            buf = self.buffers[name] = torch.empty(shape, dtype=_F32, device=_CPU)
        return buf


def applies(attn: Attention) -> bool:
    """Whether a layer's attention is the plain kind this path computes."""
    return (not attn.gated and not attn.qk_norm and not attn.window
            and not attn.local_rotary and not attn.has_sinks
            and attn.qkv is not None and attn.out is not None)


def decoder_layer(layer, x: torch.Tensor, step: DecodeStep) -> torch.Tensor:
    """DecoderLayer.forward (model/arch/decoder.py) of a decode step: x [N, hidden] fp32,
    contiguous, the model's residual stream, which it updates in place and returns."""
    attn, mlp = layer.self_attn, layer.mlp
    norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
    N, H = x.shape
    h = norm_cpu.rms_norm(x, norm1.weight, norm1.eps, norm1.offset,
                          out=step.buffer("h", N, H))
    heads, D = (attn.h, attn.hkv), attn.d
    a = attn_cpu.decode_step(
        attn.qkv(h).contiguous(), step.memory, attn.attn_index, step.cos, step.sin,
        step.kv_index, step.tables, step.lens, heads, attn.scale, step.block_size,
        step.splits, out=step.buffer("attn", N, attn.h * D),
        scratch=step.buffer("scratch", attn_cpu.decode_scratch(N, heads, D, step.splits)))
    h = norm_cpu.add_rms_norm(x, attn.out(a).contiguous(), norm2.weight, norm2.eps,
                              norm2.offset, out=h)
    if isinstance(mlp, MLP) and mlp.gate_up is not None:
        gu = mlp.gate_up(h).contiguous()
        act = norm_cpu.silu_and_mul(gu, out=step.buffer("act", N, gu.shape[1] // 2))
        return x.add_(mlp.down(act))
    return x.add_(mlp(h))

"""flash-attn's paged varlen attention (`flash-attn` 2.x, where installed) behind
ckptd's step signature, for prefill steps. flash-attn 2 reads a paged cache only in
pages of a multiple of 256 tokens, so it serves a pool of such pages (--block-size
256); other pools keep ckptd's Triton kernel (kernels/dispatch.py: usable).

The pool [P, n_attn, 2, B, Hkv, D] gives flash-attn one layer's K and V caches as
[P, B, Hkv, D] views; sequence i sees its ctx_lens[i] cached tokens and its new ones
(causal, aligned to the end, as flash-attn aligns it when q is shorter than k).
"""

from __future__ import annotations

import torch

from ckptd.kernels.varlen import Varlen

PAGE_MULTIPLE = 256


def usable(kv_pool: torch.Tensor) -> bool:
    return kv_pool.dtype in (torch.float16, torch.bfloat16) \
        and kv_pool.shape[3] % PAGE_MULTIPLE == 0 and kv_pool.stride(5) == 1


def step_attention(q, kv_pool, layer: int, varlen: Varlen, scale: float) -> torch.Tensor:
    """q [N, Hq, D]: each sequence's new tokens (their K/V written). Returns [N, Hq, D]."""
    from flash_attn import flash_attn_varlen_func  # optional (extra gpu)

    lens = [c + b - a for c, a, b in zip(varlen.ctx, varlen.cu, varlen.cu[1:])]
    seq_lens = varlen.ctx_lens + (varlen.cu_seqlens[1:] - varlen.cu_seqlens[:-1])
    cu_k = torch.nn.functional.pad(seq_lens.cumsum(0, dtype=torch.int32), (1, 0))
    return flash_attn_varlen_func(
        q, kv_pool[:, layer, 0], kv_pool[:, layer, 1], varlen.cu_seqlens, cu_k,
        varlen.max_q_len, max(lens, default=0), softmax_scale=scale, causal=True,
        block_table=varlen.page_tables)

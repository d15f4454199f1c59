"""Attention over paged KV through torch's scaled_dot_product_attention: the CPU fast
path. Same arguments and results as naive.py (the reference it is tested against).

SDPA's fused CPU kernels never build the [Hq, T, ctx] score matrix in fp32 the way
the reference does; at a 2048-token chunk over 30K cached tokens that is ~4x
faster here, and the gap grows with the context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.paged_attention import naive


def _sdpa(q, k, v, ctx_len, scale):
    """q [T, Hq, D] at positions ctx_len..ctx_len+T-1; k, v [ctx_len+T, Hkv, D]."""
    T, S = q.shape[0], k.shape[0]
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k.to(q.dtype), v.to(q.dtype)))
    # query i sees keys 0 .. ctx_len + i: a causal mask aligned to the lower right
    mask = None if T == 1 else torch.ones(T, S, dtype=torch.bool, device=q.device).tril(ctx_len)
    o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale,
                                       enable_gqa=q.shape[1] != k.shape[1])
    return o[0].transpose(0, 1)


def paged_attention(q, kv_pool, layer, page_table, ctx_len, scale):
    """q [T, Hq, D]: the last T of ctx_len + T tokens in page_table's pages. [T, Hq, D]."""
    return naive.paged_attention(q, kv_pool, layer, page_table, ctx_len, scale, _sdpa)


def paged_decode_attention(q, kv_pool, layer, page_tables, seq_lens, scale):
    """q [N, Hq, D], one query per sequence of length seq_lens[n]. [N, Hq, D]."""
    return naive.paged_decode_attention(q, kv_pool, layer, page_tables, seq_lens, scale, _sdpa)

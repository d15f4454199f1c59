"""Attention over paged KV through torch's scaled_dot_product_attention: the CPU fast
path. Same arguments and results as naive.py (the reference it is tested against).

SDPA's fused CPU kernels never build the [Hq, T, ctx] score matrix in fp32 the way
the reference does; at a 2048-token chunk over 30K cached tokens that is ~4x
faster here, and the gap grows with the context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.paged_attention import layout, naive


def _heads(q, k, v, ctx_len, scale):
    """q [T, Hq, D] at positions ctx_len..ctx_len+T-1; k, v [Hkv, ctx_len+T, D]."""
    T, Hq, D = q.shape
    Hkv, S = k.shape[0], k.shape[1]
    rep = Hq // Hkv
    # the rep query heads that share a kv head become rows of one head, [rep * T] long:
    # SDPA then streams each K/V once per kv head, not once per query head
    qh = q.transpose(0, 1).reshape(1, Hkv, rep * T, D)
    kh, vh = k.to(q.dtype).unsqueeze(0), v.to(q.dtype).unsqueeze(0)
    mask = None
    if T > 1:  # query i sees keys 0 .. ctx_len + i: causal, aligned to the lower right
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(ctx_len).repeat(rep, 1)
    o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return o.view(Hq, T, D).transpose(0, 1)


def _sdpa(q, k, v, ctx_len, scale):
    """As _heads, with k, v [ctx_len+T, Hkv, D] (the reference's layout)."""
    return _heads(q, k.transpose(0, 1), v.transpose(0, 1), ctx_len, scale)


def paged_attention(q, kv_pool, layer, page_table, ctx_len, scale):
    """q [T, Hq, D]: the last T of ctx_len + T tokens in page_table's pages. [T, Hq, D]."""
    memory = layout.head_major(kv_pool)
    if memory is None:
        return naive.paged_attention(q, kv_pool, layer, page_table, ctx_len, scale, _sdpa)
    k, v = layout.sequence_kv(memory, layer, page_table, ctx_len + q.shape[0], kv_pool.shape[3])
    return _heads(q, k, v, ctx_len, scale)


def paged_decode_attention(q, kv_pool, layer, page_tables, seq_lens, scale):
    """q [N, Hq, D], one query per sequence of length seq_lens[n]. [N, Hq, D]."""
    memory = layout.head_major(kv_pool)
    if memory is None:
        return naive.paged_decode_attention(q, kv_pool, layer, page_tables, seq_lens, scale,
                                            _sdpa)
    out = torch.empty_like(q)
    for n in range(q.shape[0]):
        L = int(seq_lens[n])
        k, v = layout.sequence_kv(memory, layer, page_tables[n], L, kv_pool.shape[3])
        out[n] = _heads(q[n:n + 1], k, v, L - 1, scale)[0]
    return out

"""Attention over paged KV, plain torch.

kv_pool [P, n_attn, 2, B, Hkv, D]: page p, attention layer l, K (0) or V (1),
offset in page, kv head, head dim. A sequence's tokens live in the pages of its
page table, in order: token i is at page_table[i // B], offset i % B.
"""

from __future__ import annotations

import torch


def write_kv(kv_pool, layer, slots, k, v):
    """Write k, v [N, Hkv, D] at flat slots [N] (page * B + offset) of `layer`, in place."""
    B = kv_pool.shape[3]
    pages, offs = slots // B, slots % B
    kv_pool[pages, layer, 0, offs] = k.to(kv_pool.dtype)
    kv_pool[pages, layer, 1, offs] = v.to(kv_pool.dtype)


def _gather_seq(kv_pool, layer, page_table, n_tokens):
    """K, V [n_tokens, Hkv, D] of one sequence."""
    pages = kv_pool[page_table.long(), layer]                 # [n_pages, 2, B, Hkv, D]
    kv = pages.transpose(0, 1).reshape(2, -1, *pages.shape[-2:])
    return kv[0, :n_tokens], kv[1, :n_tokens]


def _attend(q, k, v, ctx_len, scale):
    """q [T, Hq, D] at positions ctx_len..ctx_len+T-1; k, v [ctx_len+T, Hkv, D]."""
    T, Hq, _ = q.shape
    rep = Hq // k.shape[1]
    k = k.float().repeat_interleave(rep, dim=1)
    v = v.float().repeat_interleave(rep, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), k) * scale
    q_pos = torch.arange(T, device=q.device)[:, None] + ctx_len
    k_pos = torch.arange(k.shape[0], device=q.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v).to(q.dtype)


def paged_attention(q, kv_pool, layer, page_table, ctx_len, scale, attend=_attend):
    """Causal attention for the last T tokens of one sequence.

    q [T, Hq, D]; the sequence has ctx_len + T tokens whose K/V are all in the pages of
    page_table (int32 [n_pages]) already. GQA: Hq is a multiple of Hkv. Returns [T, Hq, D].
    `attend(q, k, v, ctx_len, scale)` does the math (sdpa.py passes torch's fused one).
    """
    k, v = _gather_seq(kv_pool, layer, page_table, ctx_len + q.shape[0])
    return attend(q, k, v, ctx_len, scale)


def paged_decode_attention(q, kv_pool, layer, page_tables, seq_lens, scale, attend=_attend):
    """One query per sequence: q [N, Hq, D] is the last token of sequence n, whose length
    is seq_lens[n] (int32 [N]); page_tables int32 [N, max_pages] (padding ignored).
    Returns [N, Hq, D].
    """
    out = torch.empty_like(q)
    for n in range(q.shape[0]):
        L = int(seq_lens[n])
        k, v = _gather_seq(kv_pool, layer, page_tables[n], L)
        out[n] = attend(q[n:n + 1], k, v, L - 1, scale)[0]
    return out


def gather_pages(kv_pool, page_ids):
    """Contiguous copy of whole pages: [n, n_attn, 2, B, Hkv, D]."""
    idx = torch.as_tensor(page_ids, dtype=torch.long, device=kv_pool.device)
    return kv_pool.index_select(0, idx).contiguous()


def scatter_pages(kv_pool, page_ids, pages):
    """Write whole pages [n, n_attn, 2, B, Hkv, D] into the pool at page_ids, in place."""
    kv_pool[torch.as_tensor(page_ids, dtype=torch.long, device=kv_pool.device)] = \
        pages.to(kv_pool.device, kv_pool.dtype)

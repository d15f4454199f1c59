"""Attention over paged KV, plain torch.

kv_pool [P, n_attn, 2, B, Hkv, D]: page p, attention layer l, K (0) or V (1),
offset in page, kv head, head dim. A sequence's tokens live in the pages of its
page table, in order: token i is at page_table[i // B], offset i % B.

A sliding window (`window` W > 0) lets the query at position p see keys p - W + 1 .. p
only; the pages before the first query's window are never read (the device may have
freed them).

Attention sinks (`sinks` [Hq] or None, gpt-oss): a learned logit per query head that
joins every row's softmax denominator and adds no value, so a row's weights sum to
less than 1 (transformers' `eager_attention_forward` of GptOss).
"""

from __future__ import annotations

import torch


def write_kv(kv_pool, layer, kv_index, k, v):
    """Write k, v [N, Hkv, D] at flat positions kv_index [N] (page * B + offset) of
    `layer`, in place."""
    B = kv_pool.shape[3]
    pages, offs = kv_index // B, kv_index % B
    kv_pool[pages, layer, 0, offs] = k.to(kv_pool.dtype)
    kv_pool[pages, layer, 1, offs] = v.to(kv_pool.dtype)


def _gather_seq(kv_pool, layer, page_table, n_tokens, first_page=0):
    """K, V [n_tokens - first_page * B, Hkv, D] of one sequence, from its page
    first_page on."""
    pages = kv_pool[page_table[first_page:].long(), layer]   # [n_pages, 2, B, Hkv, D]
    kv = pages.transpose(0, 1).reshape(2, -1, *pages.shape[-2:])
    n = n_tokens - first_page * kv_pool.shape[3]
    return kv[0, :n], kv[1, :n]


def first_page(ctx_len, window, block_size):
    """The first page a chunk after ctx_len tokens reads: 0, or under a window the page
    of the first query's first key."""
    return max(0, ctx_len - window + 1) // block_size if window else 0


def _attend(q, k, v, ctx_len, scale, window=0, sinks=None):
    """q [T, Hq, D] at positions ctx_len..ctx_len+T-1; k, v [ctx_len+T, Hkv, D]; a query
    sees the window keys up to its own (all of them when window is 0); sinks [Hq] join
    each head's softmax as one more logit without a value."""
    T, Hq, _ = q.shape
    rep = Hq // k.shape[1]
    k = k.float().repeat_interleave(rep, dim=1)
    v = v.float().repeat_interleave(rep, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), k) * scale
    q_pos = torch.arange(T, device=q.device)[:, None] + ctx_len
    k_pos = torch.arange(k.shape[0], device=q.device)[None, :]
    hidden = k_pos > q_pos
    if window:
        hidden |= k_pos <= q_pos - window
    scores = scores.masked_fill(hidden, float("-inf"))
    if sinks is None:
        return torch.einsum("hts,shd->thd", scores.softmax(-1), v).to(q.dtype)
    sink = sinks.float()[:, None, None].expand(-1, T, 1)
    weights = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
    return torch.einsum("hts,shd->thd", weights, v).to(q.dtype)


def paged_attention(q, kv_pool, layer, page_table, ctx_len, scale, attend=_attend, window=0,
                    sinks=None):
    """Causal attention for the last T tokens of one sequence.

    q [T, Hq, D]; the sequence has ctx_len + T tokens whose K/V are all in the pages of
    page_table (int32 [n_pages]) already (under a window, those of the pages it reads).
    GQA: Hq is a multiple of Hkv. Returns [T, Hq, D]. `attend(q, k, v, ctx_len, scale,
    window, sinks)` does the math (sdpa.py passes torch's fused one); under a window the keys
    start at a page boundary, shifting queries and keys alike.
    """
    first = first_page(ctx_len, window, kv_pool.shape[3])
    k, v = _gather_seq(kv_pool, layer, page_table, ctx_len + q.shape[0], first)
    return attend(q, k, v, ctx_len - first * kv_pool.shape[3], scale, window, sinks)


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

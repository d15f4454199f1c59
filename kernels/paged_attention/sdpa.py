"""Attention over paged KV through torch's fused CPU attention: the CPU fast path. Same
arguments and results as naive.py (the reference it is tested against).

The fused kernel never builds the [Hq, T, ctx] score matrix in fp32 the way the
reference does. On a head-major pool (layout.py) no mask is built either: the T
queries see every cached token, so the cache is attended without one, span by span
(each run of consecutive pages in place), and the T new tokens with is_causal; the
parts are merged through their log-sum-exp. GQA: the query heads that share a kv head
become rows of one head, so each K/V span streams once per kv head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ckptd.kernels.paged_attention import layout, naive

_fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_SPLIT_ROWS = 64       # query rows per kv head up to which keys are split in two
_SPLIT_KEYS = 1024     # keys from which they are


def _attend_all(q, k, v, scale):
    """q [Hq, R, D] rows that see every key of k, v [Hkv, S, D] (no mask). Returns
    [(out [Hq, R, D], log-sum-exp [Hq, R] fp32)], one pair per part of the keys.

    A few rows over many keys are cut into key halves, attended as a batch of two: the
    fused kernel hands out (batch, kv head, 32-row block) items to the threads, and 3 kv
    heads x 2 row blocks of 14 tokens land unevenly on 2 threads, while 12 items do not
    (docs/BENCHMARKS.md, Measurements behind the code)."""
    Hq, R, D = q.shape
    Hkv, S = k.shape[0], k.shape[1]
    rows = Hq // Hkv * R                  # query rows per kv head
    n = 2 if rows <= _SPLIT_ROWS and S >= _SPLIT_KEYS and S % 2 == 0 else 1
    qb = q.reshape(1, Hkv, -1, D).expand(n, -1, -1, -1)
    kb, vb = (x.to(q.dtype).view(Hkv, n, S // n, D).transpose(0, 1) for x in (k, v))
    out, lse = _fused(qb, kb, vb, 0.0, False, scale=scale)
    return [(out[i].reshape(Hq, R, D), lse[i].reshape(Hq, R)) for i in range(n)]


def _attend_causal(q, k, v, scale):
    """q [Hq, T, D] over k, v [Hkv, T, D] of the same T tokens, causal."""
    Hq, T, D = q.shape
    rep = Hq // k.shape[0]
    k, v = (x.to(q.dtype).repeat_interleave(rep, 0)[None] for x in (k, v))
    out, lse = _fused(q[None], k, v, 0.0, True, scale=scale)
    return out.reshape(Hq, T, D), lse.reshape(Hq, T)


def _merge(parts):
    """Attention over the union of the parts' keys from each part's (out, lse)."""
    if len(parts) == 1:
        return parts[0][0]
    outs = torch.stack([o for o, _ in parts])                    # [P, Hq, T, D]
    weights = torch.stack([lse for _, lse in parts]).softmax(0)   # [P, Hq, T] fp32
    return (outs.float() * weights[..., None]).sum(0).to(outs.dtype)


def _paged(q, memory, layer, page_table, ctx_len, scale, block_size):
    """q [Hq, T, D]: the last T of ctx_len + T tokens. Returns [Hq, T, D]."""
    T = q.shape[1]
    seen = ctx_len + 1 if T == 1 else ctx_len  # keys every query sees
    parts = [part for kv in layout.key_spans(memory, layer, page_table, 0, seen, block_size)
             for part in _attend_all(q, kv[0], kv[1], scale)]
    if T > 1:
        new = layout.key_spans(memory, layer, page_table, ctx_len, ctx_len + T, block_size, 1)
        kv = new[0] if len(new) == 1 else torch.cat(new, dim=2)
        parts.append(_attend_causal(q, kv[0], kv[1], scale))
    return _merge(parts)


def _sdpa(q, k, v, ctx_len, scale):
    """q [T, Hq, D] at positions ctx_len..ctx_len+T-1; k, v [ctx_len+T, Hkv, D] (the
    reference's layout, for a pool that is not head-major): one masked call."""
    T, Hq, D = q.shape
    S, Hkv = k.shape[0], k.shape[1]
    rep = Hq // Hkv
    qh = q.transpose(0, 1).reshape(1, Hkv, rep * T, D)
    kh, vh = (x.to(q.dtype).transpose(0, 1)[None] for x in (k, v))
    mask = None
    if T > 1:  # query i sees keys 0 .. ctx_len + i: causal, aligned to the lower right
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(ctx_len).repeat(rep, 1)
    o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return o.view(Hq, T, D).transpose(0, 1)


def paged_attention(q, kv_pool, layer, page_table, ctx_len, scale):
    """q [T, Hq, D]: the last T of ctx_len + T tokens in page_table's pages. [T, Hq, D]."""
    memory = layout.head_major(kv_pool)
    if memory is None:
        return naive.paged_attention(q, kv_pool, layer, page_table, ctx_len, scale, _sdpa)
    out = _paged(q.transpose(0, 1), memory, layer, page_table, ctx_len, scale,
                 kv_pool.shape[3])
    return out.transpose(0, 1)


def paged_decode_attention(q, kv_pool, layer, page_tables, seq_lens, scale):
    """q [N, Hq, D], one query per sequence of length seq_lens[n]. [N, Hq, D]."""
    memory = layout.head_major(kv_pool)
    if memory is None:
        return naive.paged_decode_attention(q, kv_pool, layer, page_tables, seq_lens, scale,
                                            _sdpa)
    out = torch.empty_like(q)
    for n in range(q.shape[0]):
        L = int(seq_lens[n])
        out[n] = _paged(q[n][:, None], memory, layer, page_tables[n], L - 1, scale,
                        kv_pool.shape[3])[:, 0]
    return out

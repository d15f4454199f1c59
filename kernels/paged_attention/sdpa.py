"""Attention over paged KV through torch's fused CPU attention: the CPU fast path. Same
arguments and results as naive.py (the reference it is tested against).

The fused kernel never builds the [Hq, T, ctx] score matrix in fp32 the way the
reference does. On a head-major pool (layout.py) no mask is built either: the T
queries see every cached token, so the cache is attended without one, span by span
(each run of consecutive pages in place), and the T new tokens with is_causal; the
parts are merged through their log-sum-exp. GQA: the query heads that share a kv head
become rows of one head, so each K/V span streams once per kv head. Under a sliding
window the keys from the first query's window on are attended in one masked call. A
decode step (one token, no window) reads the pages in place through cpu.c instead: a
few rows are memory-bound, and the fused kernel would want the context as spans or
gathered.

Attention sinks (gpt-oss: a logit per query head in every row's softmax denominator,
no value) join through the log-sum-exp as well: as one more part of zero output whose
log-sum-exp is the sink, or as out * sigmoid(lse - sink) after a masked call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ckptd.kernels.paged_attention import cpu, layout, naive

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


def _sink_part(sinks, q):
    """The sinks as a part for _merge: no output, log-sum-exp the sink [Hq, T]."""
    Hq, T, D = q.shape
    return (torch.zeros(Hq, T, D, dtype=q.dtype, device=q.device),
            sinks.float()[:, None].expand(Hq, T))


def _paged(q, memory, layer, page_table, ctx_len, scale, block_size, sinks=None):
    """q [Hq, T, D]: the last T of ctx_len + T tokens. Returns [Hq, T, D]."""
    T = q.shape[1]
    if T == 1 and cpu.supports(memory, q, block_size):
        # a decode: its few rows over the pages where they lie (cpu.c), no gather
        part = cpu.attend(q, memory, layer, page_table, ctx_len + 1, scale, block_size)
        return part[0] if sinks is None else _merge([part, _sink_part(sinks, part[0])])
    seen = ctx_len + 1 if T == 1 else ctx_len  # keys every query sees
    parts = [part for kv in layout.key_spans(memory, layer, page_table, 0, seen, block_size)
             for part in _attend_all(q, kv[0], kv[1], scale)]
    if T > 1:
        new = layout.key_spans(memory, layer, page_table, ctx_len, ctx_len + T, block_size, 1)
        kv = new[0] if len(new) == 1 else torch.cat(new, dim=2)
        parts.append(_attend_causal(q, kv[0], kv[1], scale))
    if sinks is not None:
        parts.append(_sink_part(sinks, q))
    return _merge(parts)


def _mask(T, S, ctx_len, window, device):
    """[T, S] bool: query i (at ctx_len + i) sees key j. Causal, aligned to the lower
    right; under a window also j > ctx_len + i - window."""
    seen = torch.ones(T, S, dtype=torch.bool, device=device)
    mask = seen.tril(ctx_len)
    return mask & ~seen.tril(ctx_len - window) if window else mask


def _masked(q, k, v, mask, scale, sinks):
    """q [1, Hkv, R, D] rows over k, v [1, Hkv, S, D] where the bool mask [R, S] (None:
    everywhere) says; sinks [Hq] or None, the R rows of a kv head its rep query heads'
    T tokens each. Returns [1, Hkv, R, D]."""
    if sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    bias = None
    if mask is not None:         # the fused kernel takes an additive mask of q's dtype
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device)
        bias = bias.masked_fill_(~mask, float("-inf"))
    out, lse = _fused(q, k, v, 0.0, False, attn_mask=bias, scale=scale)
    Hkv, R = q.shape[1], q.shape[2]
    Hq = sinks.shape[0]
    sink = sinks.float()[:, None].expand(Hq, R * Hkv // Hq).reshape(lse.shape)
    return out * torch.sigmoid(lse - sink)[..., None].to(out.dtype)


def _sdpa(q, k, v, ctx_len, scale, window=0, sinks=None):
    """q [T, Hq, D] at positions ctx_len..ctx_len+T-1; k, v [ctx_len+T, Hkv, D] (the
    reference's layout, for a pool that is not head-major): one masked call."""
    T, Hq, D = q.shape
    S, Hkv = k.shape[0], k.shape[1]
    rep = Hq // Hkv
    qh = q.transpose(0, 1).reshape(1, Hkv, rep * T, D)
    kh, vh = (x.to(q.dtype).transpose(0, 1)[None] for x in (k, v))
    mask = None
    if T > 1 or window:
        mask = _mask(T, S, ctx_len, window, q.device).repeat(rep, 1)
    o = _masked(qh, kh, vh, mask, scale, sinks)
    return o.view(Hq, T, D).transpose(0, 1)


def _paged_window(q, memory, layer, page_table, ctx_len, scale, block_size, window,
                  sinks=None):
    """q [Hq, T, D]: the last T of ctx_len + T tokens, each seeing the window's keys:
    those from the first query's window on, in one masked call. Returns [Hq, T, D]."""
    Hq, T, D = q.shape
    start = max(0, ctx_len - window + 1)
    spans = layout.key_spans(memory, layer, page_table, start, ctx_len + T, block_size, 1)
    kv = spans[0] if len(spans) == 1 else torch.cat(spans, dim=2)     # [2, Hkv, S, D]
    Hkv, S = kv.shape[1], kv.shape[2]
    rep = Hq // Hkv
    mask = _mask(T, S, ctx_len - start, window, q.device).repeat(rep, 1)
    o = _masked(q.reshape(1, Hkv, rep * T, D), kv[0].to(q.dtype)[None],
                kv[1].to(q.dtype)[None], mask, scale, sinks)
    return o.view(Hq, T, D)


def paged_attention(q, kv_pool, layer, page_table, ctx_len, scale, window=0, sinks=None):
    """q [T, Hq, D]: the last T of ctx_len + T tokens in page_table's pages; window: keys
    a query sees (0: all); sinks [Hq] or None. [T, Hq, D]."""
    memory = layout.head_major(kv_pool)
    if memory is None:
        return naive.paged_attention(q, kv_pool, layer, page_table, ctx_len, scale, _sdpa,
                                     window, sinks)
    if window:
        out = _paged_window(q.transpose(0, 1), memory, layer, page_table, ctx_len, scale,
                            kv_pool.shape[3], window, sinks)
    else:
        out = _paged(q.transpose(0, 1), memory, layer, page_table, ctx_len, scale,
                     kv_pool.shape[3], sinks)
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

"""Causal GQA attention over paged KV in Triton: chunked prefill and batched decode.

One kernel serves both. Sequence i has ctx_len[i] tokens already in its pages and
appends q_len[i] more (their K/V written to the pages before the call); its queries
attend to every key at a position <= their own. A program takes one KV head and a
block of BR rows of the (token, query head of that KV head's group) pairs, so the
G query heads sharing a KV head read each K/V block once, and walks the keys in
blocks of BN with an online softmax. Key n of a sequence lives at page
page_table[n // B], offset n % B, so any block size works. When there are too few
programs to fill a GPU (decode of a few long sequences), each also takes one of
S key ranges and a second kernel merges the S partial softmaxes. Under a sliding
window W (> 0) a query at position p sees keys p - W + 1 .. p: a program starts at its
first row's first key, so the keys (and pages) before the window are never read.
Attention sinks (gpt-oss: a logit per query head in the softmax denominator, without a
value) start the online softmax of the first key range: its running max is the sink and
its running sum 1, so every later rescaling and the split merge carry them unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels import launch


@triton.jit
def _paged_attn_kernel(q, pool, o, part_acc, part_ml, tables, cu_q, ctx_lens, sinks, scale,
                       layer, G, B, Hq, n_split, split_len, window, has_sinks, stride_qt,
                       stride_qh, stride_ot, stride_oh, stride_tab, stride_p, stride_l, stride_kv,
                       stride_b, stride_h,
                       D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr,
                       PREC: tl.constexpr):
    i_n = tl.program_id(0)
    i_r = tl.program_id(1)
    i_kh = tl.program_id(2) // n_split
    i_s = tl.program_id(2) % n_split
    bos = tl.load(cu_q + i_n).to(tl.int64)
    q_len = tl.load(cu_q + i_n + 1).to(tl.int64) - bos
    if i_r * BR < q_len * G:
        ctx = tl.load(ctx_lens + i_n).to(tl.int64)
        r = i_r * BR + tl.arange(0, BR)
        mr = r < q_len * G
        tq = r // G                                   # token of the row inside the chunk
        hq = i_kh * G + r % G                         # its query head
        d = tl.arange(0, BD)
        md = d < D
        # products in the pool's dtype (bf16 tensor cores on a GPU), accumulated in fp32
        b_q = tl.load(q + (bos + tq)[:, None] * stride_qt + hq[:, None] * stride_qh + d[None, :],
                      mask=mr[:, None] & md[None, :], other=0.).to(pool.dtype.element_ty)
        q_pos = ctx + tq
        # keys past the last query of this block are masked for every row: stop there
        kv_end = ctx + tl.minimum(q_len, (i_r * BR + BR - 1) // G + 1)
        kv_lo = i_s.to(tl.int64) * split_len
        kv_hi = tl.minimum(kv_end, kv_lo + split_len)
        if window > 0:      # the block's first query sees nothing before its window
            kv_lo = tl.maximum(kv_lo, ctx + (i_r * BR) // G - window + 1)
        base = pool + layer * stride_l + i_kh * stride_h
        p_tab = tables + i_n * stride_tab
        m_i = tl.full((BR,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BR,), dtype=tl.float32)
        if (has_sinks != 0) & (i_s == 0):   # the sink: one more logit, of value 0
            m_i = tl.load(sinks + hq, mask=mr, other=0.).to(tl.float32)
            l_i = tl.full((BR,), 1.0, dtype=tl.float32)
        acc = tl.zeros((BR, BD), dtype=tl.float32)
        for s0 in range(kv_lo, kv_hi, BN):
            n = s0 + tl.arange(0, BN)
            mn = n < kv_hi
            page = tl.load(p_tab + n // B, mask=mn, other=0).to(tl.int64)
            p_k = base + page[:, None] * stride_p + (n % B)[:, None] * stride_b + d[None, :]
            m_kv = mn[:, None] & md[None, :]
            b_k = tl.load(p_k, mask=m_kv, other=0.)                             # [BN, BD]
            b_v = tl.load(p_k + stride_kv, mask=m_kv, other=0.)
            s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * scale      # [BR, BN]
            seen = (n[None, :] <= q_pos[:, None]) & mn[None, :]
            if window > 0:
                seen = seen & (n[None, :] > q_pos[:, None] - window)
            s = tl.where(seen, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            # a row may see no key yet in a split of a long chunk: keep exp() off -inf - -inf
            m_use = tl.where(m_new == float("-inf"), 0., m_new)
            p = tl.exp(s - m_use[:, None])
            alpha = tl.exp(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(b_v.dtype), b_v, input_precision=PREC)
            m_i = m_new
        m_out = mr[:, None] & md[None, :]
        if n_split > 1:
            # unnormalized partial results of this key range; _combine_kernel merges them
            row = ((bos + tq) * Hq + hq) * n_split + i_s
            tl.store(part_acc + row[:, None] * D + d[None, :], acc, mask=m_out)
            tl.store(part_ml + row * 2, m_i, mask=mr)
            tl.store(part_ml + row * 2 + 1, l_i, mask=mr)
        else:
            out = acc / l_i[:, None]
            tl.store(o + (bos + tq)[:, None] * stride_ot + hq[:, None] * stride_oh + d[None, :],
                     out.to(o.dtype.element_ty), mask=m_out)


@triton.jit
def _combine_kernel(part_acc, part_ml, o, Hq, n_split, stride_ot, stride_oh,
                    D: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr):
    """One (token, query head): the n_split partial softmaxes, BS at a time."""
    i_t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    row0 = (i_t * Hq + h) * n_split
    d = tl.arange(0, BD)
    md = d < D
    m_max = tl.full((), float("-inf"), dtype=tl.float32)
    for s0 in range(0, n_split, BS):
        sp = s0 + tl.arange(0, BS)
        m_max = tl.maximum(m_max, tl.max(tl.load(part_ml + (row0 + sp) * 2, mask=sp < n_split,
                                                 other=float("-inf")), axis=0))
    m_use = tl.where(m_max == float("-inf"), 0., m_max)                   # no key at all
    acc = tl.zeros((BD,), dtype=tl.float32)
    den = tl.zeros((), dtype=tl.float32)
    for s0 in range(0, n_split, BS):
        sp = s0 + tl.arange(0, BS)
        ms = sp < n_split
        w = tl.exp(tl.load(part_ml + (row0 + sp) * 2, mask=ms, other=float("-inf")) - m_use)
        den += tl.sum(w * tl.load(part_ml + (row0 + sp) * 2 + 1, mask=ms, other=0.), axis=0)
        part = tl.load(part_acc + (row0 + sp)[:, None] * D + d[None, :],
                       mask=ms[:, None] & md[None, :], other=0.)
        acc += tl.sum(w[:, None] * part, axis=0)
    tl.store(o + i_t * stride_ot + h * stride_oh + d, (acc / den).to(o.dtype.element_ty),
             mask=md)


def _check_pool(q, kv_pool, layer: int) -> tuple[int, int, int]:
    if q.dim() != 3:
        raise ValueError(f"need q [N, Hq, D], got {tuple(q.shape)}")
    if kv_pool.dim() != 6:
        raise ValueError(f"need kv_pool [P, n_attn, 2, B, Hkv, D], got {tuple(kv_pool.shape)}")
    _, n_attn, two, B, Hkv, D = kv_pool.shape
    Hq = q.shape[1]
    if two != 2 or q.shape[2] != D or Hq % Hkv:
        raise ValueError(f"q {tuple(q.shape)} does not fit kv_pool {tuple(kv_pool.shape)}: "
                         "need the same head dim and query heads a multiple of KV heads")
    if not 0 <= layer < n_attn:
        raise ValueError(f"layer {layer} out of range for {n_attn} attention layers")
    if q.stride(2) != 1 or kv_pool.stride(5) != 1:
        raise ValueError("q and kv_pool must be contiguous in the head dim")
    return B, Hkv, D


def paged_attention_varlen(q, kv_pool, layer, cu_seqlens, ctx_lens, page_tables, scale,
                           max_q_len=None, num_splits=None, window=0, sinks=None):
    """Chunks of several sequences at once.

    q [N, Hq, D] packed (sequence i's queries are rows cu_seqlens[i]:cu_seqlens[i+1]);
    ctx_lens int [n]: tokens before each chunk; page_tables int32 [n, max_pages] covering
    ctx_len + q_len tokens (whose K/V are all in the pool). Returns o [N, Hq, D] in q's
    dtype. max_q_len (the longest chunk) saves a device sync when given; num_splits
    overrides how many key ranges are attended in parallel and merged; window: the keys a
    query sees (0: all); sinks [Hq] (any float dtype) or None.
    """
    B, Hkv, D = _check_pool(q, kv_pool, layer)
    n = len(ctx_lens)
    if page_tables.dim() != 2 or page_tables.shape[0] != n or len(cu_seqlens) != n + 1:
        raise ValueError(f"need page_tables [{n}, max_pages] and cu_seqlens [{n + 1}], got "
                         f"{tuple(page_tables.shape)} and {len(cu_seqlens)}")
    dev = q.device
    N, Hq, _ = q.shape
    G = Hq // Hkv
    o = torch.empty(N, Hq, D, dtype=q.dtype, device=dev)
    if n == 0 or N == 0:
        return o
    cu = torch.as_tensor(cu_seqlens, device=dev).to(torch.int32)
    ctx = torch.as_tensor(ctx_lens, device=dev).to(torch.int32)
    tables = page_tables.to(dev, torch.int32)
    if max_q_len is None:
        max_q_len = int((cu[1:] - cu[:-1]).max())
    t = launch.target(dev)
    p = launch.attention(t, D, max_q_len * G, kv_pool.dtype)
    BR, BN = p["BR"], p["BN"]
    row_blocks = triton.cdiv(max_q_len * G, BR)
    max_keys = tables.shape[1] * B                   # a bound on ctx_len + q_len, no sync
    S = num_splits or launch.attention_splits(t, n * row_blocks * Hkv, max_keys)
    split_len = triton.cdiv(triton.cdiv(max_keys, S), BN) * BN
    # unused unless split; fp32 either way, so both forms are one compile
    part_acc = torch.empty(N * Hq * S * D if S > 1 else 1, dtype=torch.float32, device=dev)
    part_ml = torch.empty(N * Hq * S * 2 if S > 1 else 1, dtype=torch.float32, device=dev)
    # without sinks an fp32 buffer stands in (never read): one compile serves both
    sink = part_ml if sinks is None else sinks.to(dev, torch.float32).contiguous()
    _paged_attn_kernel[(n, row_blocks, Hkv * S)](
        q, kv_pool, o, part_acc, part_ml, tables, cu, ctx, sink, float(scale), layer, G, B, Hq,
        S, split_len, int(window), int(sinks is not None), q.stride(0), q.stride(1),
        o.stride(0), o.stride(1), tables.stride(0), kv_pool.stride(0), kv_pool.stride(1),
        kv_pool.stride(2), kv_pool.stride(3), kv_pool.stride(4), D=D, **p.kwargs())
    if S > 1:
        _combine_kernel[(N, Hq)](part_acc, part_ml, o, Hq, S, o.stride(0), o.stride(1), D=D,
                                 **launch.attention_combine(t, D).kwargs())
    return o


def paged_attention(q, kv_pool, layer, page_table, ctx_len, scale, window=0, sinks=None):
    """The last T tokens of one sequence: q [T, Hq, D]; page_table int32 [n_pages];
    ctx_len tokens precede them. Returns [T, Hq, D]."""
    if page_table.dim() != 1:
        raise ValueError(f"need page_table [n_pages], got {tuple(page_table.shape)}")
    T = q.shape[0]
    return paged_attention_varlen(q, kv_pool, layer, [0, T], [int(ctx_len)], page_table[None],
                                  scale, max_q_len=T, window=window, sinks=sinks)


def paged_decode_attention(q, kv_pool, layer, page_tables, seq_lens, scale, num_splits=None):
    """One query per sequence: q [N, Hq, D] is the last token of sequence n, whose length
    is seq_lens[n] (int32 [N]); page_tables int32 [N, max_pages]. Returns [N, Hq, D].
    Long contexts are split into key ranges attended in parallel (flash-decoding)."""
    N = q.shape[0]
    lens = torch.as_tensor(seq_lens, device=q.device)
    cu = torch.arange(N + 1, dtype=torch.int32, device=q.device)
    return paged_attention_varlen(q, kv_pool, layer, cu, lens - 1, page_tables, scale,
                                  max_q_len=1, num_splits=num_splits)

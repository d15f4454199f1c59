"""Attention over paged KV for several packed chunks at once, plain torch: a loop
over naive.paged_attention. The reference for
triton_attention.paged_attention_varlen; same arguments.
"""

from __future__ import annotations

import torch

from ckptd.kernels.paged_attention import naive
from ckptd.kernels.varlen import host_cu


def paged_attention_varlen(q, kv_pool, layer, cu_seqlens, ctx_lens, page_tables, scale,
                           max_q_len=None, window=0, sinks=None):
    """q [N, Hq, D] packed by cu_seqlens int [n + 1]; ctx_lens int [n]; page_tables int32
    [n, max_pages]; window: keys a query sees (0: all); sinks [Hq] or None. Returns o
    [N, Hq, D]. max_q_len is accepted and unused."""
    cu = host_cu(cu_seqlens)
    o = torch.empty_like(q)
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        ctx = int(ctx_lens[i])
        pages = -(-(ctx + b - a) // kv_pool.shape[3])
        o[a:b] = naive.paged_attention(q[a:b], kv_pool, layer, page_tables[i, :pages], ctx,
                                       scale, window=window, sinks=sinks)
    return o

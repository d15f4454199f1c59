"""Sliding-window attention (Gemma 3's local layers, gpt-oss' banded ones) over paged KV:
every kernel equals a dense masked softmax written here from the definition (the query
at position p sees keys p - W + 1 .. p), and none reads a page that lies wholly before
the first query's window: those pages are NaN here, as a page the device freed may hold
anything."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels.paged_attention import layout, naive, sdpa, triton_attention
from ckptd.kernels.paged_attention import reference_varlen as ref_varlen

pytestmark = pytest.mark.usefixtures("triton_env")

B, HKV, D = 8, 2, 16


def _dense(q, k, v, ctx, window, scale):
    """q [T, Hq, D] at positions ctx..; k, v [ctx + T, Hkv, D]: the definition."""
    T, Hq, _ = q.shape
    rep = Hq // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.einsum("thd,shd->hts", q, k) * scale
    qp = torch.arange(T)[:, None] + ctx
    kp = torch.arange(k.shape[0])[None, :]
    s = s.masked_fill((kp > qp) | (kp <= qp - window), float("-inf"))
    return torch.einsum("hts,shd->thd", s.softmax(-1), v)


def _sequences(spans, window, seed, head_major=False):
    """A pool holding each (ctx, T) sequence's K/V on scattered pages, the pages before
    its first query's window filled with NaN; returns pool, tables, [(k, v)]."""
    g = torch.Generator().manual_seed(seed)
    pages = [-(-(c + t) // B) for c, t in spans]
    P = sum(pages) + 2
    shape = (2, 2, B, HKV, D)
    pool = layout.new_pool(P, shape, torch.float32, torch.device("cpu"), head_major)
    pool.fill_(float("nan"))
    perm = torch.randperm(P, generator=g).to(torch.int32)
    tables = torch.zeros(len(spans), max(pages), dtype=torch.int32)
    kvs, at = [], 0
    for i, ((ctx, T), n) in enumerate(zip(spans, pages)):
        tables[i, :n] = perm[at:at + n]
        at += n
        k, v = torch.randn(2, ctx + T, HKV, D, generator=g)
        start = max(0, ctx - window + 1) // B * B       # the first page read
        pos = torch.arange(start, ctx + T)
        naive.write_kv(pool, 1, tables[i].long()[pos // B] * B + pos % B, k[start:], v[start:])
        kvs.append((k, v))
    return pool, tables, kvs


CASES = [(0, 1, 4), (0, 40, 5), (30, 1, 8), (37, 21, 16), (100, 3, 9), (64, 64, 64),
         (5, 10, 100)]


@pytest.mark.parametrize(("ctx", "T", "window"), CASES)
@pytest.mark.parametrize("impl", ["naive", "sdpa", "sdpa-head-major", "triton"])
def test_one_sequence_equals_the_definition(ctx, T, window, impl, close):
    pool, tables, [(k, v)] = _sequences([(ctx, T)], window, ctx + T + window,
                                        head_major=impl == "sdpa-head-major")
    q = torch.randn(T, 6, D, generator=torch.Generator().manual_seed(ctx))
    fn = {"naive": naive, "sdpa": sdpa, "sdpa-head-major": sdpa,
          "triton": triton_attention}[impl].paged_attention
    got = fn(q, pool, 1, tables[0], ctx, 0.3, window=window)
    assert close(got, _dense(q, k, v, ctx, window, 0.3))


@pytest.mark.parametrize("splits", [1, 3])
def test_packed_sequences_and_key_splits_equal_the_definition(splits, close):
    """One launch for several sequences (a decode beside chunks), the key range split in
    parallel parts (flash-decoding: some parts lie wholly before a window)."""
    spans = [(0, 30), (90, 1), (41, 12), (200, 7)]
    pool, tables, kvs = _sequences(spans, 24, 5)
    cu = [0]
    for _, t in spans:
        cu.append(cu[-1] + t)
    q = torch.randn(cu[-1], 4, D, generator=torch.Generator().manual_seed(5))
    want = torch.cat([_dense(q[a:b], k, v, c, 24, 0.25)
                      for (c, _), (k, v), a, b in zip(spans, kvs, cu, cu[1:])])
    ctx = torch.tensor([c for c, _ in spans])
    got = triton_attention.paged_attention_varlen(q, pool, 1, cu, ctx, tables, 0.25,
                                                  num_splits=splits, window=24)
    assert close(got, want)
    assert close(ref_varlen.paged_attention_varlen(q, pool, 1, cu, ctx, tables, 0.25,
                                                   window=24), want)


def test_a_window_wider_than_the_context_is_full_causal_attention(close):
    pool, tables, [(k, v)] = _sequences([(20, 9)], 1000, 3)
    q = torch.randn(9, 4, D, generator=torch.Generator().manual_seed(3))
    full = naive.paged_attention(q, pool, 1, tables[0], 20, 0.3)
    assert close(sdpa.paged_attention(q, pool, 1, tables[0], 20, 0.3, window=1000), full)
    assert close(triton_attention.paged_attention(q, pool, 1, tables[0], 20, 0.3,
                                                  window=1000), full)

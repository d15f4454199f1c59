"""Sliding-window attention (Gemma 3's local layers, gpt-oss' banded ones) over paged KV:
every kernel equals a dense masked softmax written here from the definition (the query
at position p sees keys p - W + 1 .. p), and none reads a page that lies wholly before
the first query's window: those pages are NaN here, as a page the device freed may hold
anything. gpt-oss' attention sinks (a logit per query head in the softmax denominator,
no value) the same way, windowed or not."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels.paged_attention import layout, naive, sdpa, triton_attention
from ckptd.kernels.paged_attention import reference_varlen as ref_varlen

pytestmark = pytest.mark.usefixtures("triton_env")

B, HKV, D = 8, 2, 16


def _dense(q, k, v, ctx, window, scale, sinks=None):
    """q [T, Hq, D] at positions ctx..; k, v [ctx + T, Hkv, D]: the definition."""
    T, Hq, _ = q.shape
    rep = Hq // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.einsum("thd,shd->hts", q, k) * scale
    qp = torch.arange(T)[:, None] + ctx
    kp = torch.arange(k.shape[0])[None, :]
    hidden = (kp > qp) | (kp <= qp - window) if window else kp > qp
    p = s.masked_fill(hidden, float("-inf")).exp()
    den = p.sum(-1, keepdim=True)
    if sinks is not None:
        den = den + sinks.exp()[:, None, None]
    return torch.einsum("hts,shd->thd", p / den, v)


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


SINK_CASES = [(0, 1, 0), (30, 1, 0), (37, 21, 0), (100, 3, 9), (5, 10, 16), (64, 1, 24)]


@pytest.mark.parametrize(("ctx", "T", "window"), SINK_CASES)
@pytest.mark.parametrize("impl", ["naive", "sdpa", "sdpa-head-major", "triton"])
def test_sinks_join_the_denominator(ctx, T, window, impl, close):
    """Sinks on full and windowed layers, prefill chunks and decodes (the head-major pool's
    decode goes through cpu.c): each head's weights shrink by its sink as defined."""
    pool, tables, [(k, v)] = _sequences([(ctx, T)], window or 10**6, ctx + T,
                                        head_major=impl == "sdpa-head-major")
    g = torch.Generator().manual_seed(ctx + 1)
    q = torch.randn(T, 6, D, generator=g)
    sinks = torch.randn(6, generator=g) * 2
    fn = {"naive": naive, "sdpa": sdpa, "sdpa-head-major": sdpa,
          "triton": triton_attention}[impl].paged_attention
    got = fn(q, pool, 1, tables[0], ctx, 0.3, window=window, sinks=sinks)
    want = _dense(q, k, v, ctx, window, 0.3, sinks)
    assert close(got, want)
    assert not close(got, _dense(q, k, v, ctx, window, 0.3))


@pytest.mark.parametrize("splits", [1, 3])
def test_sinks_in_packed_sequences_and_key_splits(splits, close):
    """The sink enters the first key range's softmax only: split and merged, it counts once."""
    spans = [(0, 30), (90, 1), (41, 12), (200, 7)]
    cu = [0]
    for _, t in spans:
        cu.append(cu[-1] + t)
    g = torch.Generator().manual_seed(6)
    q = torch.randn(cu[-1], 4, D, generator=g)
    sinks = torch.randn(4, generator=g) * 2
    ctx = torch.tensor([c for c, _ in spans])
    for window in (0, 24):
        pool, tables, kvs = _sequences(spans, window or 10**6, 6)
        want = torch.cat([_dense(q[a:b], k, v, c, window, 0.25, sinks)
                          for (c, _), (k, v), a, b in zip(spans, kvs, cu, cu[1:])])
        got = triton_attention.paged_attention_varlen(q, pool, 1, cu, ctx, tables, 0.25,
                                                      num_splits=splits, window=window,
                                                      sinks=sinks)
        assert close(got, want)
        assert close(ref_varlen.paged_attention_varlen(q, pool, 1, cu, ctx, tables, 0.25,
                                                       window=window, sinks=sinks), want)

"""The CPU fast path for paged attention (torch SDPA) equals the plain reference."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels import dispatch
from ckptd.kernels.paged_attention import naive, sdpa


def _paged(n_tokens: int, Hkv: int, D: int, B: int, g: torch.Generator):
    """A pool holding one sequence's K/V in scattered pages, and its page table."""
    n_pages = -(-n_tokens // B)
    table = torch.randperm(n_pages + 3, generator=g)[:n_pages].to(torch.int32)
    pool = torch.full((n_pages + 3, 2, 2, B, Hkv, D), float("nan"))
    k, v = torch.randn(n_tokens, Hkv, D, generator=g), torch.randn(n_tokens, Hkv, D, generator=g)
    kv_index = table.long()[torch.arange(n_tokens) // B] * B + torch.arange(n_tokens) % B
    naive.write_kv(pool, 1, kv_index, k, v)
    return pool, table


@pytest.mark.parametrize("T, ctx", [(1, 0), (1, 70), (63, 0), (63, 100), (500, 37)])
@pytest.mark.parametrize("Hq, Hkv, D", [(6, 2, 24), (4, 4, 16)])
def test_prefill_equals_reference(T, ctx, Hq, Hkv, D):
    g = torch.Generator().manual_seed(T * 1000 + ctx + D)
    pool, table = _paged(ctx + T, Hkv, D, 16, g)
    q = torch.randn(T, Hq, D, generator=g)
    want = naive.paged_attention(q, pool, 1, table, ctx, D ** -0.5)
    got = sdpa.paged_attention(q, pool, 1, table, ctx, D ** -0.5)
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() <= 1e-5


def test_decode_batch_of_unequal_lengths_equals_reference():
    g = torch.Generator().manual_seed(7)
    Hq, Hkv, D, B = 6, 3, 20, 16
    lens = [1, 17, 130]
    pools = [_paged(L, Hkv, D, B, g) for L in lens]
    # one pool for all: stack the sequences' pages, shifting each page table
    pool = torch.cat([p for p, _ in pools])
    width = max(len(t) for _, t in pools)
    tables, base = torch.zeros(len(lens), width, dtype=torch.int32), 0
    for i, (p, t) in enumerate(pools):
        tables[i, :len(t)] = t + base
        base += p.shape[0]
    q = torch.randn(len(lens), Hq, D, generator=g)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    want = naive.paged_decode_attention(q, pool, 1, tables, seq_lens, D ** -0.5)
    got = sdpa.paged_decode_attention(q, pool, 1, tables, seq_lens, D ** -0.5)
    assert (got - want).abs().max() <= 1e-5


def test_dispatch_takes_sdpa_on_cpu_and_the_reference_when_asked(monkeypatch):
    q = torch.zeros(1, 2, 4)
    monkeypatch.setattr(dispatch, "MODE", "auto")
    assert dispatch._attention_impl(q) is sdpa
    monkeypatch.setattr(dispatch, "MODE", "torch")
    assert dispatch._attention_impl(q) is naive

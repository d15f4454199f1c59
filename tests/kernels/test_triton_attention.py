"""Triton paged attention, KV writes and page / cell copies against the references."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels import dispatch
from ckptd.kernels.paged_attention import naive
from ckptd.kernels.paged_attention import reference_varlen as ref_varlen

pytestmark = pytest.mark.usefixtures("triton_env")


def _filled(lengths, B=16, Hkv=2, D=40, n_attn=2, layer=1, seed=0, device="cpu",
            dtype=torch.float32):
    """A pool holding each sequence's K/V on scattered pages; returns pool, page tables
    [n, max_pages] (padded with page 0)."""
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // B) for n in lengths]
    pool = torch.randn(sum(pages) + 3, n_attn, 2, B, Hkv, D, generator=g).to(device, dtype)
    perm = torch.randperm(pool.shape[0], generator=g).to(torch.int32)
    tables = torch.zeros(len(lengths), max(pages), dtype=torch.int32)
    start = 0
    for i, (n, p) in enumerate(zip(lengths, pages)):
        tables[i, :p] = perm[start:start + p]
        start += p
        pos = torch.arange(n)
        kv_index = tables[i].long()[pos // B] * B + pos % B
        k, v = torch.randn(2, n, Hkv, D, generator=g).to(device, dtype)
        naive.write_kv(pool, layer, kv_index.to(device), k, v)
    return pool, tables.to(device)


@pytest.mark.parametrize(("ctx", "T"), [
    (0, 1), pytest.param(0, 63, marks=pytest.mark.grid),
    pytest.param(37, 1, marks=pytest.mark.grid), (20, 100), (0, 500)])
def test_prefill_chunk_equals_reference(ctx, T, device, close):
    pool, tables = _filled([ctx + T], seed=T, device=device)
    q = torch.randn(T, 6, 40, generator=torch.Generator().manual_seed(1)).to(device)
    want = naive.paged_attention(q, pool, 1, tables[0], ctx, 40 ** -0.5)
    got = dispatch.paged_attention(q, pool, 1, tables[0], ctx, 40 ** -0.5)
    assert close(got, want)


@pytest.mark.parametrize(("Hq", "Hkv", "D", "B"), [(4, 4, 24, 16), (8, 1, 16, 4), (6, 2, 40, 32)])
def test_head_layouts_and_block_sizes(Hq, Hkv, D, B, device, close):
    pool, tables = _filled([45], B=B, Hkv=Hkv, D=D, seed=2, device=device)
    q = torch.randn(30, Hq, D, generator=torch.Generator().manual_seed(2)).to(device)
    want = naive.paged_attention(q, pool, 1, tables[0], 15, 0.3)
    assert close(dispatch.paged_attention(q, pool, 1, tables[0], 15, 0.3), want)


def test_decode_batch_of_unequal_lengths(device, close):
    lens = [1, 17, 40, 5, 64]
    pool, tables = _filled(lens, seed=3, device=device)
    q = torch.randn(len(lens), 6, 40, generator=torch.Generator().manual_seed(3)).to(device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    want = naive.paged_decode_attention(q, pool, 1, tables, seq_lens, 0.2)
    assert close(dispatch.paged_decode_attention(q, pool, 1, tables, seq_lens, 0.2), want)


@pytest.mark.parametrize("splits", [2, 5])
def test_key_range_splits_merge_to_the_same_result(splits, device, close):
    # flash-decoding: the form a GPU picks for a few long sequences, forced here
    from ckptd.kernels.paged_attention.triton_attention import (
        paged_attention_varlen,
        paged_decode_attention,
    )
    lens = [300, 17, 1]
    pool, tables = _filled(lens, seed=9, device=device)
    q = torch.randn(3, 6, 40, generator=torch.Generator().manual_seed(9)).to(device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    want = naive.paged_decode_attention(q, pool, 1, tables, seq_lens, 0.2)
    got = paged_decode_attention(q, pool, 1, tables, seq_lens, 0.2, num_splits=splits)
    assert close(got, want)
    # a chunk's early rows see no key of the later ranges
    q = torch.randn(60, 6, 40, generator=torch.Generator().manual_seed(10)).to(device)
    want = naive.paged_attention(q, pool, 1, tables[0], 240, 0.2)
    got = paged_attention_varlen(q, pool, 1, [0, 60], [240], tables[:1], 0.2,
                                 num_splits=splits)
    assert close(got, want)


def test_varlen_chunks_of_several_sequences(device, close):
    ctx, q_lens = [0, 30, 7, 100], [63, 1, 20, 5]
    pool, tables = _filled([c + n for c, n in zip(ctx, q_lens)], seed=4, device=device)
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    q = torch.randn(cu[-1], 6, 40, generator=torch.Generator().manual_seed(4)).to(device)
    want = ref_varlen.paged_attention_varlen(q, pool, 1, cu, ctx, tables, 0.15)
    got = dispatch.paged_attention_varlen(q, pool, 1, torch.tensor(cu), torch.tensor(ctx),
                                          tables, 0.15)
    assert close(got, want)


def test_half_precision(device, close):
    pool, tables = _filled([90], seed=5, device=device, dtype=torch.float16)
    q = torch.randn(50, 6, 40, generator=torch.Generator().manual_seed(5)).to(device).half()
    want = naive.paged_attention(q, pool, 1, tables[0], 40, 0.15)
    got = dispatch.paged_attention(q, pool, 1, tables[0], 40, 0.15)
    assert got.dtype == torch.float16 and close(got, want, 2e-3)


def test_write_kv_fills_exactly_the_kv_index(device):
    pool = torch.randn(6, 3, 2, 4, 2, 24, generator=torch.Generator().manual_seed(6)).to(device)
    want = pool.clone()
    kv_index = torch.tensor([5, 6, 7, 8, 21, 0], device=device)
    k, v = torch.randn(2, 6, 2, 24, generator=torch.Generator().manual_seed(7)).to(device)
    naive.write_kv(want, 2, kv_index, k, v)
    dispatch.write_kv(pool, 2, kv_index, k, v)
    assert torch.equal(pool, want)
    strided_k = torch.randn(6, 2, 48, device=device)[..., :24]    # a view, not contiguous
    naive.write_kv(want, 0, kv_index, strided_k, v)
    dispatch.write_kv(pool, 0, kv_index, strided_k, v)
    assert torch.equal(pool, want)


def test_pages_and_states_round_trip(device):
    g = torch.Generator().manual_seed(8)
    pool = torch.randn(7, 2, 2, 4, 2, 24, generator=g).to(device)
    ids = [4, 1, 6]
    pages = dispatch.gather_pages(pool, ids)
    assert torch.equal(pages, naive.gather_pages(pool, ids))
    other, want = torch.zeros_like(pool), torch.zeros(pool.shape, device=device)
    dispatch.scatter_pages(other, torch.tensor(ids), pages)
    naive.scatter_pages(want, ids, pages)
    assert torch.equal(other, want)
    ssm = torch.randn(5, 3, 4, 24, 40, generator=g).to(device)   # [cells, n_rec, H, K, V]
    states = dispatch.gather_states(ssm, [3, 0])
    assert torch.equal(states, ssm[[3, 0]])
    conv = torch.zeros(5, 3, 40, 3, dtype=torch.float16, device=device)
    dispatch.scatter_states(conv, [2], torch.randn(1, 3, 40, 3, generator=g).to(device))
    assert conv[2].abs().sum() > 0 and conv[[0, 1, 3, 4]].abs().sum() == 0


def test_bad_inputs_raise_value_error(device):
    pool, tables = _filled([10], device=device)
    q = torch.randn(10, 5, 40, device=device)
    with pytest.raises(ValueError, match="multiple"):
        dispatch.paged_attention(q, pool, 1, tables[0], 0, 0.1)
    with pytest.raises(ValueError, match="layer"):
        dispatch.paged_attention(q[:, :4], pool, 2, tables[0], 0, 0.1)
    with pytest.raises(ValueError, match="k, v"):
        dispatch.write_kv(pool, 0, torch.tensor([0, 1]), q[:2, :2, :8], q[:2, :2, :8])
    with pytest.raises(ValueError, match="rows"):
        dispatch.scatter_pages(pool, [0, 1], pool[:1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 is wrong in the interpreter")
def test_bf16_on_gpu(close):
    pool, tables = _filled([3000, 1500, 70], B=16, Hkv=8, D=128, device="cuda",
                           dtype=torch.bfloat16)
    q = torch.randn(1000, 32, 128, device="cuda", dtype=torch.bfloat16)
    want = naive.paged_attention(q, pool, 1, tables[0], 2000, 128 ** -0.5)
    assert close(dispatch.paged_attention(q, pool, 1, tables[0], 2000, 128 ** -0.5), want, 2e-2)
    lens = torch.tensor([3000, 1500, 70], dtype=torch.int32, device="cuda")
    want = naive.paged_decode_attention(q[:3], pool, 1, tables, lens, 128 ** -0.5)
    got = dispatch.paged_decode_attention(q[:3], pool, 1, tables, lens, 128 ** -0.5)
    assert close(got, want, 2e-2)

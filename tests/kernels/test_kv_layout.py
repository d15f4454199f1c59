"""A head-major KV pool (the CPU layout) reads and writes like a page-major one, and
attention over it equals the reference whether a sequence's pages are consecutive (read
in place) or scattered (gathered)."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels.paged_attention import layout, naive, sdpa

SHAPE = (2, 2, 16, 3, 8)  # n_attn, K/V, B, Hkv, D


def _pools(n_pages: int):
    cpu = torch.device("cpu")
    return (layout.new_pool(n_pages, SHAPE, torch.float32, cpu, head_major=False),
            layout.new_pool(n_pages, SHAPE, torch.float32, cpu, head_major=True))


def test_head_major_pool_is_the_same_tensor_to_every_reader():
    flat, head = _pools(6)
    assert layout.head_major(flat) is None
    assert layout.head_major(head).shape == (2, 2, 3, 6 * 16, 8)
    g = torch.Generator().manual_seed(0)
    pages = torch.randn(3, *SHAPE, generator=g)
    k, v = torch.randn(5, 3, 8, generator=g), torch.randn(5, 3, 8, generator=g)
    for pool in (flat, head):
        naive.scatter_pages(pool, [4, 0, 2], pages)
        naive.write_kv(pool, 1, torch.tensor([17, 18, 19, 20, 95]), k, v)
    assert torch.equal(flat, head)
    got = naive.gather_pages(head, [2, 4])
    assert got.is_contiguous() and torch.equal(got, naive.gather_pages(flat, [2, 4]))


@pytest.mark.parametrize("table", [[3, 4, 5, 6], [5, 2, 6, 0], [1]])
@pytest.mark.parametrize("T", [1, 9])
def test_attention_on_head_major_pool_equals_reference(table, T):
    g = torch.Generator().manual_seed(len(table) * 10 + T)
    flat, head = _pools(8)
    n_tokens = len(table) * 16 - 5 if len(table) > 1 else 12
    table = torch.tensor(table, dtype=torch.int32)
    kv_index = table.long()[torch.arange(n_tokens) // 16] * 16 + torch.arange(n_tokens) % 16
    k, v = torch.randn(n_tokens, 3, 8, generator=g), torch.randn(n_tokens, 3, 8, generator=g)
    for pool in (flat, head):
        naive.write_kv(pool, 1, kv_index, k, v)
    q = torch.randn(T, 6, 8, generator=g)
    ctx = n_tokens - T
    want = naive.paged_attention(q, flat, 1, table, ctx, 8 ** -0.5)
    got = sdpa.paged_attention(q, head, 1, table, ctx, 8 ** -0.5)
    assert (got - want).abs().max() <= 1e-5
    one = sdpa.paged_decode_attention(q[-1:], head, 1, table[None], torch.tensor([n_tokens]),
                                      8 ** -0.5)
    assert (one - want[-1:]).abs().max() <= 1e-5


def test_runs_of_consecutive_pages_are_read_in_place():
    _, head = _pools(8)
    memory = layout.head_major(head)
    table = torch.tensor([2, 3, 4, 7, 0], dtype=torch.int32)
    spans = layout.key_spans(memory, 0, table, 5, 70, 16)  # tokens 5..69: pages 2-4, 7, 0
    assert [s.shape for s in spans] == [(2, 3, 43, 8), (2, 3, 16, 8), (2, 3, 6, 8)]
    assert spans[0].data_ptr() == memory[0, :, :, 37:].data_ptr()
    assert spans[1].data_ptr() == memory[0, :, :, 112:].data_ptr()
    assert spans[2].data_ptr() == memory[0].data_ptr()
    gathered = layout.key_spans(memory, 0, table, 5, 70, 16, max_spans=2)
    assert len(gathered) == 1 and torch.equal(gathered[0], torch.cat(spans, dim=2))
    assert layout.key_spans(memory, 0, table, 9, 9, 16) == []


def _attention_case(table, n_tokens, T, dtype, seed):
    """A head-major and a page-major pool holding the same sequence, and its queries."""
    g = torch.Generator().manual_seed(seed)
    flat, head = _pools(max(table) + 1)
    flat, head = flat.to(dtype), head.to(dtype)
    table = torch.tensor(table, dtype=torch.int32)
    kv_index = table.long()[torch.arange(n_tokens) // 16] * 16 + torch.arange(n_tokens) % 16
    k, v = torch.randn(n_tokens, 3, 8, generator=g), torch.randn(n_tokens, 3, 8, generator=g)
    for pool in (flat, head):
        naive.write_kv(pool, 1, kv_index, k, v)
    return flat, head, table, torch.randn(T, 6, 8, generator=g).to(dtype)


# spans: one run, three runs, more runs than are attended in place (one gather)
@pytest.mark.parametrize("table", [[2, 3, 4, 5, 6], [6, 7, 0, 1, 3], [9, 1, 7, 3, 5, 0, 8]])
@pytest.mark.parametrize("T, ctx", [(1, 0), (1, 60), (40, 0), (40, 30), (17, 47)])
def test_spans_and_new_tokens_merge_to_the_reference(table, T, ctx):
    flat, head, table, q = _attention_case(table, ctx + T, T, torch.float32, T * 100 + ctx)
    want = naive.paged_attention(q, flat, 1, table, ctx, 8 ** -0.5)
    got = sdpa.paged_attention(q, head, 1, table, ctx, 8 ** -0.5)
    assert (got - want).abs().max() <= 1e-5


def test_bf16_attention_is_close_to_the_fp32_reference():
    flat, head, table, q = _attention_case([4, 5, 6, 0, 1, 2, 3], 100, 14, torch.bfloat16, 3)
    want = naive.paged_attention(q.float(), flat.float(), 1, table, 86, 8 ** -0.5)
    got = sdpa.paged_attention(q, head, 1, table, 86, 8 ** -0.5)
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max() <= 0.03


# long spans with few query rows: keys cut in halves, attended as a batch of two
@pytest.mark.parametrize("T, ctx", [(14, 1200), (14, 1201), (1, 1499), (30, 1100)])
@pytest.mark.parametrize("runs", [1, 2])
def test_long_spans_split_in_halves_equal_the_reference(T, ctx, runs):
    n_pages = -(-(ctx + T) // 16)
    table = list(range(1, n_pages + 1))
    if runs == 2:                                  # a long run, then a short one elsewhere
        table = table[:-3] + [n_pages + 5, n_pages + 6, n_pages + 7]
    flat, head, table, q = _attention_case(table, ctx + T, T, torch.float32, T + ctx + runs)
    want = naive.paged_attention(q, flat, 1, table, ctx, 8 ** -0.5)
    got = sdpa.paged_attention(q, head, 1, table, ctx, 8 ** -0.5)
    assert (got - want).abs().max() <= 1e-5

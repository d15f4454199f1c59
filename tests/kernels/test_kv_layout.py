"""A head-major KV pool (the CPU layout) reads and writes like a page-major one, and
attention over it equals the reference whether a sequence's pages are consecutive (read
in place) or scattered (gathered)."""

from __future__ import annotations

import pytest
import torch

from kernels.paged_attention import layout, naive, sdpa

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
    slots = table.long()[torch.arange(n_tokens) // 16] * 16 + torch.arange(n_tokens) % 16
    k, v = torch.randn(n_tokens, 3, 8, generator=g), torch.randn(n_tokens, 3, 8, generator=g)
    for pool in (flat, head):
        naive.write_kv(pool, 1, slots, k, v)
    q = torch.randn(T, 6, 8, generator=g)
    ctx = n_tokens - T
    want = naive.paged_attention(q, flat, 1, table, ctx, 8 ** -0.5)
    got = sdpa.paged_attention(q, head, 1, table, ctx, 8 ** -0.5)
    assert (got - want).abs().max() <= 1e-5
    one = sdpa.paged_decode_attention(q[-1:], head, 1, table[None], torch.tensor([n_tokens]),
                                      8 ** -0.5)
    assert (one - want[-1:]).abs().max() <= 1e-5


def test_consecutive_pages_are_read_in_place():
    _, head = _pools(8)
    memory = layout.head_major(head)
    kv = layout.sequence_kv(memory, 0, torch.tensor([2, 3, 4], dtype=torch.int32), 40, 16)
    assert kv.shape == (2, 3, 40, 8) and kv.data_ptr() == memory[0, :, :, 32:].data_ptr()
    scattered = layout.sequence_kv(memory, 0, torch.tensor([4, 3], dtype=torch.int32), 20, 16)
    assert scattered.data_ptr() != memory.data_ptr()

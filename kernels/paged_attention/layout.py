"""Where a KV pool's bytes sit.

Every part indexes a pool as [P, n_attn, 2, B, Hkv, D] (page, attention layer, K/V,
offset, kv head, head dim): that is the contract. On the GPU the memory is laid out
that way too, so a page is one contiguous row (Triton copies whole rows). On the CPU
the memory is laid out head-major, [n_attn, 2, Hkv, P * B, D], and the pool is a
permuted view of it: one layer's keys for one head are then rows of one matrix, so a
sequence whose pages are consecutive is attended in place, with no copy, and any
other sequence with one gather of exactly its tokens.
"""

from __future__ import annotations

import torch


def new_pool(num_pages: int, kv_shape: tuple[int, ...], dtype: torch.dtype,
             device: torch.device, head_major: bool) -> torch.Tensor:
    """A zeroed pool [num_pages, *kv_shape] with kv_shape = (n_attn, 2, B, Hkv, D)."""
    if not head_major:
        return torch.zeros((num_pages, *kv_shape), dtype=dtype, device=device)
    n_attn, two, B, Hkv, D = kv_shape
    memory = torch.zeros((n_attn, two, Hkv, num_pages, B, D), dtype=dtype, device=device)
    return memory.permute(3, 0, 1, 4, 2, 5)


def head_major(kv_pool: torch.Tensor) -> torch.Tensor | None:
    """The pool's memory as [n_attn, 2, Hkv, P * B, D] (a view), or None when the pool
    is not laid out head-major."""
    P, n_attn, two, B, Hkv, D = kv_pool.shape
    memory = kv_pool.permute(1, 2, 4, 0, 3, 5)
    if P == 0 or not memory.is_contiguous():
        return None
    return memory.view(n_attn, two, Hkv, P * B, D)


def sequence_kv(memory: torch.Tensor, layer: int, page_table: torch.Tensor, n_tokens: int,
                block_size: int) -> torch.Tensor:
    """K and V [2, Hkv, n_tokens, D] of one sequence from head-major memory: a view
    when its pages are consecutive, else a gather of its tokens."""
    pages = page_table[:-(-n_tokens // block_size)].long()
    first = int(pages[0])
    if int(pages[-1]) - first == len(pages) - 1 and bool((pages.diff() == 1).all()):
        start = first * block_size
        return memory[layer, :, :, start:start + n_tokens]
    offsets = torch.arange(block_size, device=pages.device)
    slots = (pages[:, None] * block_size + offsets).reshape(-1)[:n_tokens]
    return memory[layer].index_select(2, slots.to(memory.device))

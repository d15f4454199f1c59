"""Where a KV pool's bytes sit.

Every part indexes a pool as [P, n_attn, 2, B, Hkv, D] (page, attention layer, K/V,
offset, kv head, head dim): that is the contract. On the GPU the memory is laid out
that way too, so a page is one contiguous row (Triton copies whole rows). On the CPU
the memory is laid out head-major, [n_attn, 2, Hkv, P * B, D], and the pool is a
permuted view of it: one layer's keys for one head are then rows of one matrix, so each
run of a sequence's consecutive pages is attended in place, with no copy, and a
sequence split into many runs with one gather of exactly its tokens.
"""

from __future__ import annotations

import torch

RESIDENT_BYTES = 256 << 20     # of a CPU pool, written at start so it is resident


def new_pool(num_pages: int, kv_shape: tuple[int, ...], dtype: torch.dtype,
             device: torch.device, head_major: bool) -> torch.Tensor:
    """A pool [num_pages, *kv_shape] with kv_shape = (n_attn, 2, B, Hkv, D).

    On a GPU it is zeroed (masked kernels may read a page's unwritten rows). On the
    CPU attention reads only computed tokens, and the pool is sized by a memory
    budget, so its memory is left for the kernel to commit as pages are first
    written, but for the lowest pages (handed out first), written now: a restore
    into them after a restart would otherwise fault its output in page by page."""
    if not head_major:
        return torch.zeros((num_pages, *kv_shape), dtype=dtype, device=device)
    n_attn, two, B, Hkv, D = kv_shape
    memory = torch.empty((n_attn, two, Hkv, num_pages, B, D), dtype=dtype, device=device)
    page_bytes = memory[:, :, :, :1].numel() * memory.element_size()
    memory[:, :, :, :RESIDENT_BYTES // max(page_bytes, 1)].zero_()
    return memory.permute(3, 0, 1, 4, 2, 5)


def head_major(kv_pool: torch.Tensor) -> torch.Tensor | None:
    """The pool's memory as [n_attn, 2, Hkv, P * B, D] (a view), or None when the pool
    is not laid out head-major."""
    P, n_attn, two, B, Hkv, D = kv_pool.shape
    memory = kv_pool.permute(1, 2, 4, 0, 3, 5)
    if P == 0 or not memory.is_contiguous():
        return None
    return memory.view(n_attn, two, Hkv, P * B, D)


def key_spans(memory: torch.Tensor, layer: int, page_table: torch.Tensor, start: int,
              end: int, block_size: int, max_spans: int = 4) -> list[torch.Tensor]:
    """K and V of tokens start..end-1 of one sequence from head-major memory, as a list of
    [2, Hkv, n, D] spans in token order: views of the runs of consecutive pages (no copy),
    or, when the pages fall into more than max_spans runs, one gather of the tokens."""
    if end <= start:
        return []
    plan = _plan(page_table, start, end, block_size, max_spans, memory.device)
    if isinstance(plan, torch.Tensor):
        return [memory[layer].index_select(2, plan)]
    return [memory[layer, :, :, a:b] for a, b in plan]


_plans: dict[tuple, tuple] = {}


def _plan(page_table, start, end, block_size, max_spans, device):
    """The flat token rows key_spans reads: [(first, end)] of each run, or the KV indices
    to gather. Every layer of a step asks the same of the same page table, so the last few
    answers are kept (with the table itself: an id is not reused while it is held)."""
    key = (id(page_table), start, end, block_size, max_spans)
    hit = _plans.get(key)
    if hit is not None and hit[0] is page_table:
        return hit[1]
    first = start // block_size
    pages = page_table[first:-(-end // block_size)].long()
    cuts = ((pages[1:] - pages[:-1]) != 1).nonzero().flatten().add(1).tolist()
    if len(cuts) >= max_spans:
        tokens = torch.arange(start, end, device=pages.device)
        kv_index = pages[tokens // block_size - first] * block_size + tokens % block_size
        plan = kv_index.to(device)
    else:
        plan = []
        bounds = [0, *cuts, len(pages)]
        for a, b in zip(bounds, bounds[1:]):
            lo = max(start, (first + a) * block_size)
            hi = min(end, (first + b) * block_size)
            at = int(pages[a]) * block_size + lo - (first + a) * block_size
            plan.append((at, at + hi - lo))
    if len(_plans) >= 8:
        _plans.clear()
    _plans[key] = (page_table, plan)
    return plan

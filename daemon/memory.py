"""How much memory the daemon's defaults take: the KV page pool and the RAM tier.

Without flags, the daemon serves the model's whole context. KV pages are not
reserved as parallel x context up front: the pool is sized by a memory budget,
and on the CPU its memory is only committed as pages are first written, so an
idle pool costs address space, not RAM. What the pool can't hold is refused at
admission with a 4xx naming the budget.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ckptd.model.spec import StateSpec

KV_FRACTION = 0.4        # of the memory available at start, for the KV pool
HOST_FRACTION = 0.2      # for the RAM tier (uncompressed blocks and snapshots)
CUDA_FRACTION = 0.8      # of the device memory free after loading the weights


def available_bytes() -> int:
    """Memory the kernel could give now without swapping (MemAvailable), else free."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Sizes:
    kv_pages: int
    kv_bytes: int
    host_bytes: int

    @property
    def source(self) -> str:
        return f"{self.kv_pages} KV pages ({self.kv_bytes / 2**20:.0f} MiB)"


def window_rooms(spec: StateSpec, parallel: int, step_tokens: int) -> int | None:
    """Pages of the window layers' own pool (model/window_pages.py), None for a model
    without window layers: each running sequence's window (a token of slack, a page
    each side) and a step's chunk, twice over: the last windows of cached prefixes keep
    theirs for the next turn until the pool needs them (cache/windows.py)."""
    a = spec.attention
    if a is None or not a.windows:
        return None
    B = spec.block_size
    return 2 * parallel * (-(-(a.max_window + 1) // B) + 1 + -(-step_tokens // B))


def plan(page_bytes: int, device: torch.device, kv_budget: int | None,
         host_budget: int | None, context_pages: int, parallel: int,
         reserved: int = 0) -> Sizes:
    """The KV pool and RAM tier sizes: the flags where given, else a fraction of what
    is available, and for the pool at most what every slot's full context plus one
    more of cached prefix pages need (context_pages: one sequence of the longest
    context). A context longer than the pool is refused when it comes (a 4xx).
    reserved: bytes of the budget taken first (a window model's window pool)."""
    avail = available_bytes()
    if kv_budget is None:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            kv_budget = int(free * CUDA_FRACTION)
        else:
            kv_budget = int(avail * KV_FRACTION)
        kv_budget = min(kv_budget, (parallel + 1) * context_pages * page_bytes + reserved)
    # a model without attention keeps page ids for its blocks, holding no bytes
    pages = max(kv_budget - reserved, 0) // page_bytes if page_bytes else \
        (parallel + 1) * context_pages
    if host_budget is None:
        host_budget = int(avail * HOST_FRACTION)
    return Sizes(pages, pages * page_bytes, host_budget)

"""Which disk entries to evict: least-recently-used leaves first, never pinned ones.

A leaf is an entry that no other entry names as its parent, so evicting leaves
keeps every prefix closed (no block stays whose parent is gone). Evicting a
leaf can make its parent a leaf, which then competes by its own last use.

For a hybrid model a block is only restorable together with a snapshot at or
after it, so a leaf block (nothing below it, hence no snapshot) is worth nothing
until one arrives: such blocks go before any snapshot.
"""

from __future__ import annotations

import heapq

from ckptd.cache.entry import BLOCK
from ckptd.cache.store.index import DiskIndex


def pick_victims(index: DiskIndex, need_bytes: int, hybrid: bool,
                 protect: frozenset[bytes] | set[bytes] = frozenset()) -> list[bytes]:
    """Keys to delete, in order, to free at least need_bytes (fewer if pinned or
    protected entries are all that is left)."""
    if need_bytes <= 0:
        return []
    rows = index.rows
    left = index.children.counts()

    def rank(key: bytes) -> tuple:
        m = rows[key]
        return (0 if hybrid and m.kind == BLOCK else 1, m.last_used, key)

    def evictable(key: bytes) -> bool:
        return not rows[key].pinned and key not in protect and not left.get(key)

    heap = [rank(k) for k in rows if evictable(k)]
    heapq.heapify(heap)
    victims, freed = [], 0
    while freed < need_bytes and heap:
        key = heapq.heappop(heap)[-1]
        victims.append(key)
        freed += rows[key].stored_bytes
        parent = rows[key].parent
        if parent in left:
            left[parent] -= 1
            if parent in rows and evictable(parent):
                heapq.heappush(heap, rank(parent))
    return victims

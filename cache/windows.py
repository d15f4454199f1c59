"""A sliding-window model's device memory: the window layers' KV only where a live
sequence still reads it.

A query at position p of a window layer sees keys p-W+1..p, so a sequence that has
computed P tokens reads no key before P-W again (one token of slack: a draft's
verification may be taken back to the position before). Its pages wholly before
that are `window_low`; as it advances, the pages it leaves behind give their window
part's room back (model/window_pages.py), unless another live sequence holding the
page still reads it. So a 128K context holds window-sized KV in those layers on the
device, plus a step's chunk; the full layers keep every page, as before.

Exactness: the store keeps whole pages. Before a page's window part leaves the
device, the store gets a copy of it (Checkpointer.capture_blocks): a restore at any
position then reads from the store what the device lost. A prefix-table page that
lost its window part still serves the full layers; a restore takes the window's
pages (those within W of the restore point) from the device only where they kept
theirs (Restorer), else from the store.
"""

from __future__ import annotations

from ckptd.cache.checkpoints import Checkpointer
from ckptd.cache.device import DevicePages
from ckptd.cache.work import Tracked
from ckptd.model.spec import StateSpec


class Windows:
    def __init__(self, io, spec: StateSpec, checkpoints: Checkpointer, device: DevicePages,
                 live: dict[int, Tracked]) -> None:
        """live: the manager's live sequences (the dict itself, read as it changes)."""
        self.io, self.checkpoints, self.device, self.live = io, checkpoints, device, live
        self.B = spec.block_size
        self.W = spec.attention.max_window if spec.attention is not None else 0

    @property
    def on(self) -> bool:
        return self.W > 0

    def low(self, position: int) -> int:
        """Pages wholly before the keys a sequence at `position` may still read."""
        return max(0, position - self.W) // self.B

    def keep(self, pages: list[int]) -> bool:
        """Rooms for these pages (all or nothing). When the pool is short, the prefix
        table's pages no live sequence holds give theirs back first (the tails of
        finished sequences: a later restore reads them from the store)."""
        if self.io.keep_window(pages):
            return True
        if not self.on:
            return False
        self.io.drop_window(self.device.cached_pages())
        return self.io.keep_window(pages)

    def advance(self, rec: Tracked, position: int, capture: bool = True) -> None:
        """rec's sequence reached `position`: the window parts of the pages it left give
        their rooms back, those no other live sequence reads. capture: the store gets
        the blocks it lacks first (the sequence's chain holds their keys)."""
        if not self.on:
            return
        seq = rec.seq
        low = min(self.low(position), len(seq.pages))
        if low <= rec.window_low:
            return
        if capture and rec.chain is not None:
            self.checkpoints.capture_blocks(rec, low)
        left = seq.pages[rec.window_low:low]
        rec.window_low = low
        read = set()
        for other in self.live.values():
            if other is not rec:
                read.update(other.seq.pages[other.window_low:])
        self.io.drop_window([p for p in left if p not in read])

    def lacks(self, rec: Tracked, block: int, page: int) -> bool:
        """Whether `page`, standing for rec's block, lacks a window part rec still reads
        (or the store still lacks): rec keeps its own page then."""
        if not self.on or block < rec.window_low and block < rec.stored_blocks:
            return False
        return not self.io.has_window([page])[0]

    def restored(self, rec: Tracked, position: int) -> None:
        """After a restore to `position`: the window's pages keep (or get) their rooms,
        and what the store lacks stays on the device until it is captured."""
        if not self.on:
            return
        seq = rec.seq
        held = self.io.has_window(seq.pages[:-(-position // self.B)])
        # a page the store lacks that lost its window part (the store evicted it, the
        # device kept it) can't be put again: the store's chain has a gap there
        lost = [i for i in range(rec.stored_blocks, len(held)) if not held[i]]
        if lost:
            rec.stored_blocks = lost[-1] + 1
        rec.window_low = min(self.low(position), rec.stored_blocks)

    def check(self) -> None:
        """Every page of a live sequence from its window_low (which its window may still
        read) or from what the store lacks holds its window part. AssertionError names
        a page that does not."""
        if not self.on:
            return
        for rec in self.live.values():
            seq = rec.seq
            first = rec.window_low
            if rec.chain is not None:
                first = min(first, rec.stored_blocks)
            pages = seq.pages[first:-(-seq.num_computed // self.B)]
            for p, h in zip(pages, self.io.has_window(pages)):
                assert h, f"sequence {seq.id}: page {p} lost its window part while read"

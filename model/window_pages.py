"""Where the device keeps the sliding-window layers' KV: pages of their own.

A page id (cache/device.py) names a block of every attention layer's KV. The full
layers' part lives at that id in the main pool; the window layers' part lives in a
second pool, in a "room" the page is given while some live sequence's window still
reaches the block (llama.cpp's SWA cache and vLLM's sliding-window block table do
the same: what fell out of every window costs no device memory). A page without a
room is whole for the full layers and empty for the window ones, which no query of
a sequence holding it reads any more.

The cache decides when (cache/windows.py): a room is given before a step first
writes the page, or before a restore loads its window part, and taken back when the
block falls out of the window of every live sequence holding it (after the store has
a copy of the whole page), or when the page itself is freed.
"""

from __future__ import annotations

import heapq
import threading


class WindowRooms:
    def __init__(self, num_pages: int, num_rooms: int) -> None:
        if num_rooms < 0:
            raise ValueError(f"num_rooms must be >= 0, got {num_rooms}")
        self.num_rooms = num_rooms
        self.room_of = [-1] * num_pages
        # lowest rooms first: the rooms in use stay a compact run, so a CPU pool (whose
        # memory is committed as it is first written) commits only what is ever used
        self._free = list(range(num_rooms))
        self.high_water = 0          # the most rooms in use at once (benchmarks)
        self._lock = threading.Lock()

    @property
    def in_use(self) -> int:
        return self.num_rooms - len(self._free)

    def keep(self, pages: list[int]) -> bool:
        """Give each page without a room one; all or nothing: False when too few are
        free (nothing given)."""
        with self._lock:
            room_of = self.room_of
            want = [p for p in dict.fromkeys(pages) if room_of[p] < 0]
            if len(want) > len(self._free):
                return False
            for p in want:
                room_of[p] = heapq.heappop(self._free)
            self.high_water = max(self.high_water, self.num_rooms - len(self._free))
            return True

    def drop(self, pages: list[int]) -> None:
        """Take back the rooms of these pages (those without one are left as they are)."""
        with self._lock:
            room_of = self.room_of
            for p in pages:
                r = room_of[p]
                if r >= 0:
                    room_of[p] = -1
                    heapq.heappush(self._free, r)

    def has(self, pages: list[int]) -> list[bool]:
        room_of = self.room_of
        return [room_of[p] >= 0 for p in pages]

    def rooms(self, pages: list[int], missing: int | None = None) -> list[int]:
        """Each page's room; a page without one is an error, unless `missing` is given
        (a page table's entry for a block no query reads)."""
        room_of = self.room_of
        out = [room_of[p] for p in pages]
        if missing is None:
            if any(r < 0 for r in out):
                bad = next(p for p, r in zip(pages, out) if r < 0)
                raise ValueError(f"page {bad} holds no window-layer KV on the device")
            return out
        return [r if r >= 0 else missing for r in out]

"""Page and slot bookkeeping over DeviceState.

Pages are refcounted. A sequence holds one reference to each of its pages; the
prefix table holds one more to each page it has registered. A full page of a
shared prefix is held by every sequence that uses it and is never written
again. A page returns to the free list when its last holder lets go; a page
held only by the prefix table is "cached": still findable by its key, and
reclaimed least recently used first when `alloc` finds the free list empty.

The table maps a content key (bytes computed by the caller: the cache's block
key, which covers every token up to the end of the block) to a page. Equal keys
mean equal contents, so a sequence may use a found page instead of computing it.
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict


class OutOfPages(RuntimeError):
    """Not enough free pages (or slots): the scheduler waits or refuses, it never crashes."""


class OutOfSlots(OutOfPages):
    """No free recurrent state slot."""


class PagePool:
    def __init__(self, num_pages: int) -> None:
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        self.num_pages = num_pages
        self.refs = [0] * num_pages
        # a heap: the lowest free ids go first, so a sequence's pages mostly come in
        # consecutive runs, which CPU attention reads in place (paged_attention/layout.py)
        self._free = list(range(num_pages))
        self._by_key: OrderedDict[bytes, int] = OrderedDict()  # LRU first
        self._key_of: dict[int, bytes] = {}
        self._lock = threading.Lock()

    @property
    def num_free(self) -> int:
        """Pages on the free list (not counting cached pages that could be reclaimed)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Pages held only by the prefix table: reclaimable."""
        with self._lock:
            return sum(1 for p in self._key_of if self.refs[p] == 1)

    @property
    def num_available(self) -> int:
        with self._lock:
            return len(self._free) + sum(1 for p in self._key_of if self.refs[p] == 1)

    def alloc(self, n: int) -> list[int]:
        """n pages with one reference each; reclaims LRU cached pages if the free list is
        short. Raises OutOfPages, taking nothing, when even that is not enough."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        with self._lock:
            short = n - len(self._free)
            if short > 0:
                victims = [p for p in self._by_key.values() if self.refs[p] == 1][:short]
                if len(victims) < short:
                    raise OutOfPages(f"need {n} pages, {len(self._free)} free and "
                                     f"{len(victims)} reclaimable of {self.num_pages}")
                for p in victims:
                    self._unregister(p)
                    self._drop(p)
            pages = [heapq.heappop(self._free) for _ in range(n)]
            for p in pages:
                self.refs[p] = 1
            return pages

    def incref(self, pages: list[int]) -> None:
        with self._lock:
            for p in pages:
                assert self.refs[p] > 0, f"incref of free page {p}"
                self.refs[p] += 1

    def decref(self, pages: list[int]) -> None:
        with self._lock:
            for p in pages:
                self._drop(p)

    def is_shared(self, page: int) -> bool:
        """True when someone else (another sequence or the prefix table) holds the page:
        it must not be written."""
        return self.refs[page] > 1

    def register(self, key: bytes, page: int) -> int:
        """Put a full page in the prefix table under `key` (the table takes a reference).
        Returns the page the table holds for the key: `page`, or an equal page
        registered earlier (the caller may switch to it and let its own copy go)."""
        with self._lock:
            assert self.refs[page] > 0, f"register of free page {page}"
            held = self._by_key.get(key)
            if held is not None:
                self._by_key.move_to_end(key)
                return held
            if page in self._key_of:            # one key per page: keep the first
                return page
            self._by_key[key] = page
            self._key_of[page] = key
            self.refs[page] += 1
            return page

    def lookup(self, keys: list[bytes]) -> list[int]:
        """Pages of the longest run keys[0], keys[1], ... present in the table, marked as
        recently used. Takes no reference: adopt them before the next alloc."""
        with self._lock:
            found = []
            for key in keys:
                page = self._by_key.get(key)
                if page is None:
                    break
                self._by_key.move_to_end(key)
                found.append(page)
            return found

    def evict_cached(self) -> int:
        """Forget every page held only by the prefix table; returns how many were freed."""
        with self._lock:
            victims = [p for p in self._by_key.values() if self.refs[p] == 1]
            for p in victims:
                self._unregister(p)
                self._drop(p)
            return len(victims)

    def _unregister(self, page: int) -> None:
        del self._by_key[self._key_of.pop(page)]

    def _drop(self, page: int) -> None:
        assert self.refs[page] > 0, f"decref of free page {page}"
        self.refs[page] -= 1
        if self.refs[page] == 0:
            assert page not in self._key_of, f"page {page} freed while in the prefix table"
            heapq.heappush(self._free, page)


class SlotPool:
    """Recurrent state slots: one per live sequence, never shared."""

    def __init__(self, num_slots: int) -> None:
        if num_slots <= 0:
            raise ValueError(f"num_slots must be positive, got {num_slots}")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))
        self._used: set[int] = set()
        self._lock = threading.Lock()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        with self._lock:
            if not self._free:
                raise OutOfSlots(f"all {self.num_slots} recurrent state slots are in use")
            slot = self._free.pop()
            self._used.add(slot)
            return slot

    def release(self, slot: int) -> None:
        with self._lock:
            assert slot in self._used, f"release of free slot {slot}"
            self._used.remove(slot)
            self._free.append(slot)

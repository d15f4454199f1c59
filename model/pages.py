"""Page and slot bookkeeping over DeviceState.

Pages are refcounted: a full page of a shared prefix is held by every sequence
that uses it (and by the prefix index while it is cached) and is never written
again; it returns to the free list when its last holder lets go.
"""

from __future__ import annotations

import threading


class OutOfPages(RuntimeError):
    """No free page or slot: the scheduler waits or refuses, it never crashes."""


class PagePool:
    def __init__(self, num_pages: int) -> None:
        self.refs = [0] * num_pages
        self.free = list(range(num_pages - 1, -1, -1))
        self.lock = threading.Lock()

    def alloc(self, n: int) -> list[int]:
        with self.lock:
            if n > len(self.free):
                raise OutOfPages(f"need {n} pages, {len(self.free)} free")
            pages = [self.free.pop() for _ in range(n)]
            for p in pages:
                self.refs[p] = 1
            return pages

    def incref(self, pages: list[int]) -> None:
        with self.lock:
            for p in pages:
                assert self.refs[p] > 0, f"incref of free page {p}"
                self.refs[p] += 1

    def decref(self, pages: list[int]) -> None:
        with self.lock:
            for p in pages:
                assert self.refs[p] > 0, f"decref of free page {p}"
                self.refs[p] -= 1
                if self.refs[p] == 0:
                    self.free.append(p)

    @property
    def num_free(self) -> int:
        return len(self.free)


class SlotPool:
    def __init__(self, num_slots: int) -> None:
        self.free = list(range(num_slots - 1, -1, -1))
        self.lock = threading.Lock()

    def alloc(self) -> int:
        with self.lock:
            if not self.free:
                raise OutOfPages("no free recurrent state slot")
            return self.free.pop()

    def release(self, slot: int) -> None:
        with self.lock:
            self.free.append(slot)

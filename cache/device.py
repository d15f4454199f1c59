"""The device tier: KV pages, refcounted, and the prefix table of full pages.

A sequence holds one reference to each of its pages; the prefix table holds one
more to each page it has registered. A full page of a shared prefix is held by
every sequence that uses it and is never written again. A page returns to the
free list when its last holder lets go; a page held only by the table is
"cached": still findable by its block key, and reclaimed when `alloc` finds the
free list short.

The table is closed, like the stores below it: a page is registered only after
its parent block's page (or at the root), and only leaves (pages no registered
page names as parent) are reclaimed, least recently used first. So a prompt's
registered blocks are always a leading run of its chain, found by binary search
over its keys instead of a walk. Keys are the cache's block keys (cache/keys.py):
equal keys mean equal contents; the block tokens are compared too before a page
is used.
"""

from __future__ import annotations

import heapq
import threading
from collections import Counter
from collections.abc import Callable

from ckptd.cache.children import Children
from ckptd.cache.keys import KeyChain


class OutOfPages(RuntimeError):
    """Not enough free pages: the request waits or fails, nothing crashes."""


# What the table forgot, for the records of departed entries (cache/why/gone.py):
# on_evict(rows, why), rows (key, parent key or None, tokens covered), called outside
# the table's lock, on the thread that reclaimed
OnEvict = Callable[[list[tuple[bytes, bytes | None, int]], str], None]
RECLAIMED = "least recently used, its page reclaimed for new tokens"


class DevicePages:
    def __init__(self, num_pages: int, block_size: int, on_evict: OnEvict | None = None,
                 on_free: Callable[[list[int]], None] | None = None) -> None:
        """on_free(pages): called (under the table's lock) with each page that goes back
        to the free list: a window model's rooms go back with it (cache/windows.py)."""
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        self.num_pages, self.B = num_pages, block_size
        self.refs = [0] * num_pages
        # a heap: the lowest free ids go first, so a sequence's pages mostly come in
        # consecutive runs, which CPU attention reads in place (paged_attention/layout.py)
        self._free = list(range(num_pages))
        self._by_key: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        self._parent_of: dict[bytes, bytes | None] = {}   # key -> its parent block's key
        self._position: dict[bytes, int] = {}         # key -> tokens its block ends at
        self.on_evict = on_evict
        self.on_free = on_free
        self._children = Children()                  # key -> registered keys naming it parent
        self._tokens: dict[int, bytes] = {}          # page -> its block's tokens (uint32 LE)
        self._used = [0] * num_pages                 # page -> clock of its last use
        self._clock = 0
        self._lock = threading.Lock()

    @property
    def num_free(self) -> int:
        """Pages on the free list (not counting cached pages that could be reclaimed)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Pages held only by the prefix table."""
        with self._lock:
            return sum(1 for p in self._key_of if self.refs[p] == 1)

    def cached_pages(self) -> list[int]:
        """The pages held only by the prefix table."""
        with self._lock:
            return [p for p in self._key_of if self.refs[p] == 1]

    @property
    def num_registered(self) -> int:
        return len(self._by_key)

    def alloc(self, n: int) -> list[int]:
        """n pages with one reference each; reclaims cached leaves (least recently used
        first) if the free list is short. Raises OutOfPages, taking nothing, when even
        that is not enough."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        evicted = None
        with self._lock:
            short = n - len(self._free)
            if short > 0:
                # reclaim a little more than needed: each reclaim walks the table
                evicted = self._reclaim(max(short, min(self.num_pages // 64, 256)), short)
            free = self._free
            if 8 * n >= len(free):
                # most of the free list (a long restore): the n least pages at once. A
                # sorted list is still a heap, and the free list of a fresh pool is sorted.
                free.sort()
                pages = free[:n]
                del free[:n]
            else:
                pages = [heapq.heappop(free) for _ in range(n)]
            for p in pages:
                self.refs[p] = 1
        if evicted and self.on_evict is not None:
            self.on_evict(evicted, RECLAIMED)
        return pages

    def incref(self, pages: list[int]) -> None:
        with self._lock:
            refs = self.refs
            for p in pages:
                assert refs[p] > 0, f"incref of free page {p}"
                refs[p] += 1

    def decref(self, pages: list[int]) -> None:
        with self._lock:
            for p in pages:
                self._drop(p)

    def is_shared(self, page: int) -> bool:
        """True when someone else (another sequence or the table) holds the page: it must
        not be written."""
        return self.refs[page] > 1

    def touch(self, page: int) -> None:
        """Mark a page (the deepest of a run a sequence used) as recently used."""
        with self._lock:
            self._clock += 1
            self._used[page] = self._clock

    def register(self, key: bytes, parent: bytes | None, page: int, tokens: bytes) -> int:
        """Put a full page in the table under `key`; the table takes a reference. parent:
        the key of the block before it (None for a first block), which must be
        registered: the table stays closed. Returns the page the table holds for the
        key: `page`, or an equal page registered earlier (the caller may switch to it
        and let its own copy go)."""
        with self._lock:
            assert self.refs[page] > 0, f"register of free page {page}"
            held = self._by_key.get(key)
            if held is not None:
                return held
            if page in self._key_of or (parent is not None and parent not in self._by_key):
                return page                     # one key per page; never an open chain
            self._by_key[key] = page
            self._key_of[page] = key
            self._parent_of[key] = parent
            self._position[key] = (0 if parent is None else self._position[parent]) + self.B
            self._children.add(key, parent)
            self._tokens[page] = tokens
            self._clock += 1
            self._used[page] = self._clock
            self.refs[page] += 1
            return page

    def find(self, chain: KeyChain, max_blocks: int | None = None) -> list[int]:
        """Pages holding the leading full blocks of a chain (at most max_blocks), their
        tokens checked. They carry no reference: take them before the next alloc."""
        keys = chain.keys if max_blocks is None else chain.keys[:max_blocks]
        by_key = self._by_key
        with self._lock:
            lo, hi = 0, len(keys)             # keys[:lo] are registered (the table is closed)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if keys[mid - 1] in by_key:
                    lo = mid
                else:
                    hi = mid - 1
            pages = list(map(by_key.__getitem__, keys[:lo]))
            w = 4 * self.B
            if b"".join(map(self._tokens.__getitem__, pages)) != chain.data[:lo * w]:
                # a key that names other tokens (never seen: it takes a hash collision)
                n = 0
                while n < lo and self._tokens[pages[n]] == chain.data[n * w:(n + 1) * w]:
                    n += 1
                pages = pages[:n]
            if pages:
                self._clock += 1
                self._used[pages[-1]] = self._clock
            return pages

    def holds(self, keys: list[bytes]) -> list[bool]:
        """Whether each key's page is in the prefix table (a view of the tiers)."""
        with self._lock:
            return [k in self._by_key for k in keys]

    def evict_cached(self, why: str = "every cached page dropped") -> int:
        """Forget every page held only by the table; returns how many were freed. why:
        what the departures' records say."""
        with self._lock:
            before = len(self._free)
            evicted = self._reclaim(self.num_pages, 0)
            freed = len(self._free) - before
        if evicted and self.on_evict is not None:
            self.on_evict(evicted, why)
        return freed

    def _reclaim(self, want: int, need: int) -> list[tuple[bytes, bytes | None, int]]:
        """Free up to `want` cached leaves, least recently used first; OutOfPages (freeing
        nothing) when fewer than `need` can be freed. Returns what left: (key, parent,
        position) each. Under the lock, as _unregister and _drop are."""
        refs, children = self.refs, self._children
        # Every cached page is a leaf or above cached pages only (a sequence holding a
        # block holds all blocks before it), so peeling leaves reaches all of them.
        cached = [p for p in self._key_of if refs[p] == 1]
        if len(cached) < need:
            raise OutOfPages(f"need {need + len(self._free)} pages, {len(self._free)} free "
                             f"and {len(cached)} reclaimable of {self.num_pages}")
        heap = [(self._used[p], p) for p in cached if not children.of(self._key_of[p])]
        heapq.heapify(heap)
        freed, evicted = 0, []
        while heap and freed < want:
            used, p = heapq.heappop(heap)
            left = self._unregister(p)
            evicted.append(left)
            parent = left[1]
            self._drop(p)
            freed += 1
            up = None if parent is None else self._by_key.get(parent)
            if up is not None and refs[up] == 1 and not children.of(parent):
                # its child was used more recently: it was, through it
                self._used[up] = max(self._used[up], used)
                heapq.heappush(heap, (self._used[up], up))
        return evicted

    def _unregister(self, page: int) -> tuple[bytes, bytes | None, int]:
        key = self._key_of.pop(page)
        del self._by_key[key]
        del self._tokens[page]
        parent = self._parent_of.pop(key)
        self._children.remove(key, parent)
        return key, parent, self._position.pop(key)

    def _drop(self, page: int) -> None:
        assert self.refs[page] > 0, f"decref of free page {page}"
        self.refs[page] -= 1
        if self.refs[page] == 0:
            assert page not in self._key_of, f"page {page} freed while in the prefix table"
            heapq.heappush(self._free, page)
            if self.on_free is not None:
                self.on_free([page])

    def sanity_check(self, holders: Counter[int]) -> None:
        """holders: references live sequences hold, by page. AssertionError names the
        first broken invariant."""
        with self._lock:
            free = set(self._free)
            assert len(free) == len(self._free), "a page is on the free list twice"
            for p in range(self.num_pages):
                want = holders.get(p, 0) + (p in self._key_of)
                assert self.refs[p] == want, \
                    f"page {p}: {self.refs[p]} references, {want} holders (a leaked page)"
                assert (want == 0) == (p in free), f"page {p}: free list and holders disagree"
            assert len(self._by_key) == len(self._key_of) == len(self._tokens) \
                == len(self._position)
            self._children.check(((k, p, False) for k, p in self._parent_of.items()),
                                 "the prefix table")
            for parent in self._parent_of.values():
                assert parent is None or parent in self._by_key, \
                    "a registered page's parent is gone: the prefix table is not closed"

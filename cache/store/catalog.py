"""What the store knows about its entries, under one lock.

The disk index (LMDB's meta database, mirrored in memory: cache/store/index.py),
the hits not yet written back, the puts on their way to disk, the deletes still
queued, and the counters. The store's parts (reader, committer, thinner, admin)
share it; none of them does I/O or compression while holding the lock. It is
also the view that restore planning reads (cache/lookup.py: IndexView): RAM
first, then disk.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from ckptd.cache.entry import EntryMeta
from ckptd.cache.lookup import DISK, HOST
from ckptd.cache.store.index import DiskIndex
from ckptd.cache.tiers.host import HostTier


@dataclass
class Counters:
    lookups: int = 0
    hits: int = 0            # lookups that found something to restore
    hit_tokens: int = 0      # tokens those plans covered
    corrupt: int = 0         # values that failed verification (dropped)
    missing: int = 0         # planned pieces gone by load time (evicted meanwhile)
    evicted: int = 0
    lost_writes: int = 0     # entries not written: no room (pinned fill the budget, map full)
    map_full: int = 0        # commits that found the LMDB map full (then evicted and retried)
    orphans: int = 0         # entries not written: their parent was evicted meanwhile
    thinned: int = 0         # snapshots dropped to keep a prefix's count bounded
    read_bytes: dict = field(default_factory=lambda: {"host": 0, "disk": 0, "remote": 0})


class Catalog:
    def __init__(self, index: DiskIndex, host: HostTier) -> None:
        self.lock = threading.Lock()
        self.index = index
        self.host = host
        self.touched: dict[bytes, EntryMeta] = {}     # hits not yet written to disk
        self.queued: dict[bytes, bytes] = {}          # key -> parent, for puts in the queue
        self.forgetting: set[bytes] = set()           # forgotten, their disk delete queued
        self.counters = Counters()

    def replace_index(self, index: DiskIndex) -> None:
        """A read-only store re-reads the index, which another process is writing."""
        with self.lock:
            self.index = index

    def known(self, key: bytes) -> bool:
        """On disk or on its way there. An entry only in RAM (its write was dropped, or
        it was evicted from disk) is put again: a second chance to persist."""
        with self.lock:
            return key in self.index or key in self.queued

    def has(self, key: bytes) -> bool:
        """In RAM, on disk or on its way there."""
        return self.known(key) or self.host.contains(key)

    def lacking(self, rows: list[tuple]) -> list[tuple]:
        """The rows (key first) whose key is neither in RAM, on disk nor on its way: read
        without the locks, as for a departure's record (a racing put at worst leaves a
        record of an entry that is there, and records are read only for entries that
        are not)."""
        index, queued, ram = self.index.rows, self.queued, self.host.items  # dicts: no calls
        return [r for r in rows if r[0] not in index and r[0] not in queued and r[0] not in ram]

    def take_touched(self) -> dict[bytes, EntryMeta]:
        """Hits recorded since the last call, to be written back with the next commit."""
        with self.lock:
            touched, self.touched = self.touched, {}
        return touched

    def find_many(self, keys: Sequence[bytes]) -> list[tuple[EntryMeta, str] | None]:
        """The IndexView restore planning reads (cache/lookup.py): RAM first, then disk."""
        host = self.host.metas(keys)
        with self.lock:
            rows = self.index.rows
            disk = list(map(rows.get, keys)) if rows else None
        if disk is None:
            return [None if m is None else (m, HOST) for m in host]
        return [(m, HOST) if m is not None else None if d is None else (d, DISK)
                for m, d in zip(host, disk)]

    def has_snapshots(self, parent: bytes) -> bool:
        with self.lock:
            if self.index.children.has_snapshots(parent):
                return True
        return self.host.has_snapshots(parent)

    def with_snapshots(self, parents: Sequence[bytes]) -> set[bytes]:
        with self.lock:
            found = self.index.children.with_snapshots(parents)
        return found | self.host.with_snapshots(parents)

    def children_after(self, parent: bytes) -> list[tuple[bytes, EntryMeta, str]]:
        with self.lock:
            found = {k: (k, m, DISK) for k, m in self.index.children_after(parent)}
        found.update({k: (k, m, HOST) for k, m in self.host.children_after(parent)})
        return list(found.values())

    def roots(self) -> list[bytes]:
        """The root keys (model, block size, salt) some stored entry hangs from."""
        with self.lock:
            return list(self.index.roots)

    def sanity_check(self) -> None:
        with self.lock:
            self.index.sanity_check()
        self.host.sanity_check()

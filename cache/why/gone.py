"""Entries that left the cache, and why: what a miss is explained by afterwards.

A value leaves because its tier's budget evicted it, thinning dropped it (a
snapshot), it failed verification, an admin deleted it, or it never got in: a
budget (the disk's, the write queue's) refused the write. Each departure is kept
as one small record (reason, tier, when, where in its prompt), bounded: the
oldest records go first. Snapshot records are also found by their parent block's
key, so a prompt's path can be searched for the snapshots it lost.

Records are kept in memory, saved beside the store when it closes (and every minute
by a running daemon) and read back when it opens; the inspector reads them too. A
daemon restarted still says why; a crash loses the records of its last minute,
never an entry.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from ckptd.cache.entry import BLOCK, SNAPSHOT, EntryMeta

log = logging.getLogger(__name__)

# Why an entry left (the reasons a miss reports for it: cache/why/report.py)
EVICTED, THINNED, CORRUPT, DELETED, BUDGET = "evicted", "thinned", "corrupt", "deleted", "budget"
FILE = "gone.json"
LIMIT = 1 << 15          # keys with records kept (~150 bytes a record)
PENDING = 64             # blocks_left's lists kept before they are recorded
HISTORY = 4              # records kept per key: a miss is explained as of its restore, and
#                          the same entry may depart again before that is read


class Departure(NamedTuple):
    reason: str
    tier: str                 # the tier it left: device, host, disk, remote; "" for every
    #                           tier at once
    at: float                 # unix time
    kind: str                 # block or snapshot
    position: int             # tokens its state covered
    parent: bytes
    tail: tuple[int, ...]     # a snapshot's tokens after its parent block; () for a block
    detail: str = ""


class Gone:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.lock = threading.Lock()
        self.records: OrderedDict[bytes, tuple[Departure, ...]] = OrderedDict()  # oldest first
        self.snaps: dict[bytes, set[bytes]] = {}        # parent key -> snapshot keys
        self.changed = False                            # since the last save
        self.save_lock = threading.Lock()               # one save at a time
        # blocks_left's rows, as given, until the next read or write records them
        self.pending: deque[tuple] = deque()

    def left(self, items: Iterable[tuple[bytes, EntryMeta | None]], reason: str, tier: str,
             detail: str = "", unless: str | None = None) -> None:
        """Record entries that left. unless: keep a record with this reason (a host
        eviction does not hide that the disk refused the write first)."""
        self._left(((key, m.kind, m.position, m.parent,
                     tuple(m.tokens) if m.kind == SNAPSHOT else ())
                    for key, m in items if m is not None), reason, tier, detail, unless)

    def blocks_left(self, items: list[tuple[bytes, bytes | None, int]], reason: str, tier: str,
                    detail: str = "", unless: str | None = None) -> None:
        """Record blocks that left a tier that keeps no EntryMeta (the device's prefix
        table): (key, parent key or None, position) each; unless: as for left. The list
        is kept as it is and recorded at the next read or write: a reclaim inside an
        admission pays one append, not a record a page."""
        self.pending.append((items, reason, tier, detail, unless, time.time()))
        self.changed = True
        if len(self.pending) >= PENDING:       # nothing read them for a while: bounded
            self._settle()

    def _left(self, rows, reason: str, tier: str, detail: str, unless: str | None) -> None:
        now = time.time()
        with self.lock:
            self._drain()
            self._record(rows, reason, tier, detail, unless, now)

    def _drain(self) -> None:
        """Record blocks_left's rows, in order (under the lock)."""
        while self.pending:
            items, reason, tier, detail, unless, at = self.pending.popleft()
            self._record(((key, BLOCK, position, parent or b"", ())
                          for key, parent, position in items), reason, tier, detail, unless, at)

    def _settle(self) -> None:
        if self.pending:
            with self.lock:
                self._drain()

    def _record(self, rows, reason: str, tier: str, detail: str, unless: str | None,
                at: float) -> None:
        for key, kind, position, parent, tail in rows:
            old = self.records.get(key)
            if old and old[-1].reason == unless:
                continue
            self._add(key, Departure(reason, tier, at, kind, position, parent, tail, detail))

    def _add(self, key: bytes, rec: Departure) -> None:
        self.changed = True
        hist = self.records.pop(key, ())
        self.records[key] = (*hist[1 - HISTORY:], rec)
        if rec.kind == SNAPSHOT:
            self.snaps.setdefault(rec.parent, set()).add(key)
        while len(self.records) > self.limit:
            old_key, old = self.records.popitem(last=False)
            sibs = self.snaps.get(old[-1].parent)
            if sibs is not None:
                sibs.discard(old_key)
                if not sibs:
                    del self.snaps[old[-1].parent]

    def get(self, key: bytes, before: float = math.inf) -> Departure | None:
        """The latest departure of `key` at or before `before`."""
        self._settle()
        hist = self.records.get(key)           # one dict lookup: atomic, no lock needed
        return None if hist is None else _latest(hist, before)

    def earlier(self, key: bytes, rec: Departure) -> Departure | None:
        """The departure of `key` from another tier before `rec` (a block the device
        held on after the store's copy left: that one says why it was not stored)."""
        self._settle()
        for old in reversed(self.records.get(key, ())):
            if old.at <= rec.at and old.tier != rec.tier:
                return old
        return None

    def snapshots_after(self, parent: bytes, before: float = math.inf) -> list[Departure]:
        """Departed snapshots whose parent block is `parent` (each one's latest departure
        at or before `before`)."""
        if parent not in self.snaps:           # the common case, without the lock
            return []
        with self.lock:
            keys = self.snaps.get(parent, ())
            found = [_latest(self.records[k], before) for k in keys]
        return [r for r in found if r is not None]

    def snapshots_after_any(self, parents: list[bytes],
                            before: float = math.inf) -> dict[bytes, list[Departure]]:
        """snapshots_after for each of `parents` that has some (a prompt's path in one
        call: most paths have none)."""
        if not self.snaps:
            return {}
        with self.lock:
            snaps = self.snaps
            hits = [p for p in parents if p in snaps]
        return {p: found for p in hits if (found := self.snapshots_after(p, before))}

    def __len__(self) -> int:
        self._settle()
        return len(self.records)

    # ---- beside the store ----------------------------------------------------------------
    def save(self, folder: str | Path, only_changed: bool = False) -> None:
        """Write the records to folder/gone.json (through a temporary file and a rename);
        only_changed: unless nothing was recorded since the last save."""
        with self.save_lock:
            with self.lock:                # a copy (records are immutable): recorders,
                self._drain()
                if only_changed and not self.changed:      # the engine's thread among them,
                    return                                 # never wait for the encoding
                self.changed = False
                items = list(self.records.items())
            rows = [[k.hex(), r.reason, r.tier, r.at, r.kind, r.position,
                     r.parent.hex(), list(r.tail), r.detail] for k, hist in items for r in hist]
            path = Path(folder) / FILE
            tmp = path.with_name(f"{FILE}.{os.getpid()}.tmp")
            try:
                tmp.write_text(json.dumps({"version": 1, "records": rows},
                                          separators=(",", ":")))
                os.replace(tmp, path)
            except OSError as e:   # a full or read-only disk costs the records, nothing else
                log.warning("cache: could not save the departed entries' records: %s", e)

    @classmethod
    def load(cls, folder: str | Path, limit: int = LIMIT) -> Gone:
        """The records saved in folder/gone.json; none when there is no such file or it
        is not one (it only explains misses: a bad file is set aside, not fatal)."""
        gone = cls(limit)
        path = Path(folder) / FILE
        try:
            raw = json.loads(path.read_text())
            for k, reason, tier, at, kind, pos, parent, tail, detail in raw["records"]:
                gone._add(bytes.fromhex(k), Departure(str(reason), str(tier), float(at),
                                                      str(kind), int(pos), bytes.fromhex(parent),
                                                      tuple(int(t) for t in tail), str(detail)))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("cache: %s is not a record of departed entries (%s); starting without",
                        path, e)
            gone = cls(limit)
        gone.changed = False
        return gone


def _latest(hist: tuple[Departure, ...], before: float) -> Departure | None:
    for rec in reversed(hist):
        if rec.at <= before:
            return rec
    return None

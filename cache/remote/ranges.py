"""A restore's ranged reads: where the values it needs lie (Loc), the ranged GETs that
read them (plan_ranges: adjacent values merged, cut at value boundaries), and one set
of those GETs in progress (Transfer: the bytes as they come in, the values that are
whole, decoded once a fetch takes the transfer over). cache/remote/fetch.py runs them.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Executor, Future
from typing import NamedTuple

log = logging.getLogger(__name__)
MISSING, CORRUPT = "missing", "corrupt"


class Loc(NamedTuple):
    name: str
    offset: int
    length: int
    size: int          # the object's size, as the plan knows it


class Chunk(NamedTuple):
    name: str
    start: int
    end: int
    size: int
    values: list[int]  # the locations it holds bytes of (whole or in part)


def plan_ranges(locs: list[Loc], max_bytes: int) -> list[Chunk]:
    """The ranged GETs that read locs: values adjacent in one object merged, cut at
    value boundaries into requests of at most max_bytes (a single larger value is
    cut in the middle: its parts come in parallel)."""
    order = sorted(range(len(locs)), key=lambda i: (locs[i].name, locs[i].offset))
    runs: list[list[int]] = []
    for i in order:
        if runs:
            last = locs[runs[-1][-1]]
            if last.name == locs[i].name and last.offset + last.length == locs[i].offset:
                runs[-1].append(i)
                continue
        runs.append([i])
    out: list[Chunk] = []
    for run in runs:
        first = locs[run[0]]
        start, held = first.offset, []
        for i in run:
            loc = locs[i]
            if held and loc.offset + loc.length - start > max_bytes:
                out.append(Chunk(first.name, start, loc.offset, first.size, held))
                start, held = loc.offset, []
            while loc.offset + loc.length - start > max_bytes:      # one value, cut up
                out.append(Chunk(first.name, start, start + max_bytes, first.size, [i]))
                start += max_bytes
            held.append(i)
        end = locs[run[-1]].offset + locs[run[-1]].length
        out.append(Chunk(first.name, start, end, first.size, held))
    return out


class Transfer:
    """One set of ranged GETs in progress: bytes as they come in, and the values that are
    whole. A transfer may start before anyone asks for its values (Fetcher.start: the
    restore's planning meanwhile); the values are decoded once a fetch takes it over
    (`attach`), those whole by then at once, the rest as their bytes come."""

    def __init__(self, locs: list[Loc], chunks: list[Chunk]) -> None:
        self.locs, self.chunks = locs, chunks
        self.index = {loc: i for i, loc in enumerate(locs)}
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)
        self.cancelled = False
        self.bufs: dict[int, bytearray] = {}               # loc -> its value's bytes
        self.waiting = [0] * len(locs)                     # chunks each value still needs
        for c in chunks:
            for i in c.values:
                self.waiting[i] += 1
        self.out: list = [None] * len(locs)
        self.wanted: list[bool] | None = None              # set by attach
        self.whole: list[tuple[int, memoryview]] = []      # whole before attach
        self.decode = self.pool = None
        self.open = 0                                      # wanted values not resolved
        self.decodes: list[Future] = []
        self.gets: list[Future] = []
        self.bad: set[str] = set()                         # objects with a corrupt value
        self.gone: set[str] = set()                        # objects missing (or others)
        self.started = time.perf_counter()
        self.last_byte = 0.0                               # when the last range came in
        self.got = 0                                       # bytes in

    def covers(self, locs: list[Loc]) -> bool:
        index = self.index
        return not self.cancelled and self.wanted is None and all(loc in index for loc in locs)

    def attach(self, locs: list[Loc], decode, pool: Executor) -> None:
        """Decode the values at locs (all of them this transfer's) with decode on pool:
        those whole now at once, the rest as they come. Under the lock."""
        wanted = [False] * len(self.locs)
        at = {}                                            # this transfer's index -> locs'
        for k, loc in enumerate(locs):
            wanted[self.index[loc]] = True
            at[self.index[loc]] = k
        self.wanted, self.pool = wanted, pool
        self.decode = lambda ready: decode([(at[i], v) for i, v in ready])
        self.open = sum(1 for i, w in enumerate(wanted) if w and self.out[i] is None)
        ready = [(i, v) for i, v in self.whole if wanted[i]]
        self.whole = []
        n = max(1, -(-len(ready) // 8))                    # a few values a job
        for s in range(0, len(ready), n):
            self.hand(ready[s:s + n], "")
        if not self.open:
            self.done.notify_all()

    def hand(self, ready: list[tuple[int, memoryview]], name: str) -> None:
        """Whole values to their decode (kept until a fetch attaches). Under the lock."""
        if self.decode is None:
            self.whole += ready
            return
        ready = [(i, v) for i, v in ready if self.wanted[i]]
        if ready:              # one job a part: a future per value costs more
            self.decodes.append(self.pool.submit(decode_part, self, ready, name))

    def resolve(self, i: int, result) -> None:
        """Under the lock."""
        if self.out[i] is None:
            self.out[i] = result
            if self.wanted is not None and self.wanted[i]:
                self.open -= 1
                if not self.open:
                    self.done.notify_all()


def decode_part(run: Transfer, ready: list[tuple[int, memoryview]], name: str) -> None:
    """One part's values, decoded together (a value's fixed cost, paid once for all of
    them, was most of a small value's decoding)."""
    if run.cancelled:
        return
    try:
        results = run.decode(ready)
    except Exception:                          # never a reason to fail the restore
        log.exception("remote: decoding %s failed", name)
        results = [CORRUPT] * len(ready)
    with run.lock:
        for (i, _), result in zip(ready, results):
            if result == CORRUPT:
                run.bad.add(run.locs[i].name)
            run.resolve(i, result)

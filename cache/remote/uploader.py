"""Write-behind to the remote: what LMDB committed goes up in batches, as segments and
state objects (publish.py), and nothing that serves a request waits for it.

`offer()` is called by the disk writer after each commit (cache/store/commit.py) and
returns at once. The queue holds keys and metas, not values: values are read back
from LMDB when their batch goes up, so a backlog costs ~100 bytes an entry of RAM,
not the state itself (a long context of a real model is gigabytes, and the remote
may be far slower than the disk). It is bounded in entries; beyond it an entry is
dropped and counted, as is a state whose blocks left LMDB before its turn.

One thread takes what was offered, a batch at a time:
  - a block that ends a cell (block cG - 1) puts that cell's segment: a long prefill
    goes up a segment at a time, while it runs;
  - a state (a committed snapshot) waits while its chain grows: until the cell it is
    in is full on its chain (then it names that cell's segment, shared with every
    prefix of that chain), or until its chain has had no new block for `linger`
    seconds (it ended there: the end of its last cell goes up as a segment of its
    own), or a flush. Each state follows its chain's newest block (its frontier) as
    blocks commit. An interval snapshot is taken in the middle of a prefill, whose next
    checkpoint may be far off (a minute, on a busy machine): it waits for its cell, or
    goes with the next end or branch state of its chain (which puts the segment it then
    names a part of), or goes alone once its chain has not grown for `interval_linger`.
Each batch's segments are put in parallel (`concurrency` at once), then its states.
A failed put waits `backoff`, doubling, and tries again up to `upload_attempts`
times; while the remote is in its cool-off (client.py) the puts wait instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from ckptd.cache.entry import BLOCK, INTERVAL, EntryMeta
from ckptd.cache.remote.client import RemoteClient
from ckptd.cache.remote.layout import Layout
from ckptd.cache.remote.publish import Chain, Known, Publisher, ReadValues

log = logging.getLogger(__name__)
_RECENT = 1 << 16       # blocks remembered by parent: a state committed after blocks of
                        # its chain (the writer puts blocks first) catches up through them


@dataclass
class _Waiting:
    """A committed state waiting to go up."""
    meta: EntryMeta
    size: int             # its stored bytes
    frontier: bytes       # the newest block of its chain seen
    grown: float          # when the frontier last moved
    full: bool = False    # its cell is full on its chain
    passed: set = field(default_factory=set)    # blocks the frontier moved through


class Uploader:
    def __init__(self, client: RemoteClient, layout: Layout, known: Known, chain: Chain,
                 read: ReadValues, block_size: int, block_bytes: int) -> None:
        self.client, self.cfg, self.B, self.G = client, client.config, block_size, layout.grid
        self.pool = ThreadPoolExecutor(self.cfg.concurrency, thread_name_prefix="ckptd-upload")
        self.publisher = Publisher(client, layout, known, chain, read, block_size, block_bytes,
                                   self.pool, stopping=lambda: self.closed)
        self.cond = threading.Condition()
        self.queue: deque[tuple[bytes, EntryMeta, int]] = deque()   # key, meta, stored bytes
        self.pending: dict[bytes, _Waiting] = {}
        self.frontiers: dict[bytes, set[bytes]] = {}    # block key -> states it is the front of
        self.children: OrderedDict[bytes, tuple[bytes, int]] = OrderedDict()  # recent blocks
        self.active = 0                      # entries in the batch going up now
        self.queued_bytes = 0                # stored bytes waiting (on disk, not in RAM)
        self.flushing = 0
        self.dropped = 0
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="ckptd-upload", daemon=True)
        self.thread.start()

    def offer(self, items: Sequence[tuple[bytes, EntryMeta, bytes]]) -> int:
        """Queue committed entries (key, meta, LMDB value) for upload; returns how many
        were taken. Never blocks."""
        taken = 0
        with self.cond:
            for key, meta, blob in items:
                if self.closed or self._held() >= self.cfg.queue_entries:
                    self.dropped += 1
                    continue
                self.queue.append((key, meta, len(blob)))
                self.queued_bytes += len(blob)
                taken += 1
            self.cond.notify_all()
        return taken

    def _held(self) -> int:
        return len(self.queue) + len(self.pending) + self.active

    def _run(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.closed or self._due(), self._wait())
                if self.closed and not self.flushing:
                    return
                cells, states = self._take()
                self.active = len(cells) + len(states)
            try:
                self._batch(cells, states)
            except Exception:                  # counted as failed; the thread never dies
                log.exception("remote: an upload batch failed")
                with self.publisher.lock:
                    self.publisher.counts.failed += len(states)
            finally:
                with self.cond:
                    self.active = 0
                    self.queued_bytes -= sum(w.size for _, w in states) + \
                        sum(size for _, size in cells)
                    self.cond.notify_all()

    def _linger(self, w: _Waiting) -> float:
        return self.cfg.interval_linger if w.meta.role == INTERVAL else self.cfg.linger

    def _ready(self, w: _Waiting, now: float) -> bool:
        return bool(self.flushing or self.closed) or w.full or \
            (w.meta.position // self.B) % self.G == 0 or now - w.grown >= self._linger(w)

    def _due(self) -> bool:
        now = time.monotonic()
        return bool(self.queue) or any(self._ready(w, now) for w in self.pending.values())

    def _wait(self) -> float | None:
        if not self.pending:
            return None
        due = min(w.grown + self._linger(w) for w in self.pending.values())
        return max(0.01, due - time.monotonic())

    def _take(self) -> tuple[list, list]:
        """The cells the queue completes and the states that are ready; the frontiers of
        the states that wait move with the blocks committed."""
        cells = []
        now = time.monotonic()
        while self.queue:
            key, meta, size = self.queue.popleft()
            if meta.kind != BLOCK:
                w = _Waiting(meta, size, meta.parent, now)
                self.pending[key] = w
                self._follow(key, w, now)
                continue
            self.children[meta.parent] = (key, meta.position)
            if len(self.children) > _RECENT:
                self.children.popitem(last=False)
            for s in self.frontiers.pop(meta.parent, ()):
                if s in self.pending:
                    self._follow(s, self.pending[s], now)
            if (meta.position // self.B) % self.G == 0:
                cells.append((key, size))
            else:
                self.queued_bytes -= size      # read back with its cell's segment
        states = [(k, w) for k, w in self.pending.items() if self._ready(w, now)]
        ends = {w.meta.parent for _, w in states if w.meta.role != INTERVAL}
        if ends:                   # interval states below a state going up go with it
            states += [(k, w) for k, w in self.pending.items() if not self._ready(w, now)
                       and w.meta.role == INTERVAL and ends & (w.passed | {w.meta.parent})]
        for k, w in states:
            del self.pending[k]
            waiting = self.frontiers.get(w.frontier)
            if waiting is not None:
                waiting.discard(k)
                if not waiting:
                    del self.frontiers[w.frontier]
        return cells, states

    def _follow(self, key: bytes, w: _Waiting, now: float) -> None:
        """Move a state's frontier along the blocks committed after it."""
        end = (w.meta.position // self.B // self.G + 1) * self.G   # its cell's end, blocks
        while w.frontier in self.children and not w.full:
            w.frontier, position = self.children[w.frontier]
            w.passed.add(w.frontier)
            w.grown = now
            w.full = position // self.B >= end
        if not w.full:
            self.frontiers.setdefault(w.frontier, set()).add(key)

    def _batch(self, cells: list, states: list) -> None:
        """Put the cells, then the states (the deepest first: those below them on a chain
        then name a part of the segments the deeper ones put)."""
        pub = self.publisher
        cell_jobs = pub.cells([k for k, _ in cells])
        ready = []
        for key, w in sorted(states, key=lambda s: -s[1].meta.position):
            job = pub.state_job(key, w.meta)
            if job is None:
                with pub.lock:
                    pub.counts.evicted += 1
            else:
                ready.append(job)
        pub.run(cell_jobs, ready)

    @property
    def depth(self) -> int:
        with self.cond:
            return self._held()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything offered so far is up (or failed): waiting states go
        at once."""
        with self.cond:
            self.flushing += 1
            self.cond.notify_all()
            try:
                return self.cond.wait_for(lambda: not self._held(), timeout)
            finally:
                self.flushing -= 1

    def close(self) -> None:
        """Give what waits close_timeout seconds to go up, unless the remote is failing
        (a daemon stops promptly), then drop the rest."""
        deadline = time.monotonic() + self.cfg.close_timeout
        with self.cond:
            self.flushing += 1
            self.cond.notify_all()
            while self._held() and self.client.available():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(min(left, 0.1))
            self.flushing -= 1
            self.closed = True
            self.dropped += len(self.queue) + len(self.pending)
            self.queue.clear()
            self.pending.clear()
            self.frontiers.clear()
            self.cond.notify_all()
        # A put stuck on a hung remote runs on a daemon thread: the process may exit
        # under it (an S3 put is whole or nothing, and a state goes up last).
        self.thread.join(2.0)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict:
        c = asdict(self.publisher.counts)
        with self.cond:
            depth, waiting, held = len(self.queue) + self.active, len(self.pending), self._held()
            queued, dropped = self.queued_bytes, self.dropped
        return {"depth": held, "queued": depth, "waiting_states": waiting, "bytes": queued,
                "bound_entries": self.cfg.queue_entries, "dropped": dropped,
                "uploaded": c["segments"] + c["states"],
                "uploaded_bytes": c["segment_bytes"] + c["state_bytes"], **c}

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
  - a state (a committed snapshot) waits until its cell is full on its chain (then it
    names that cell's segment), or until no commit came for `linger` seconds (the
    chain ended there: the end of its last cell goes up as its own segment), or
    `max_linger` after it came, or a flush;
each batch's segments are put in parallel (`concurrency` at once), then its states.
A failed put waits `backoff`, doubling, and tries again up to `upload_attempts`
times; while the remote is in its cool-off (client.py) the puts wait instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from ckptd.cache.entry import BLOCK, EntryMeta
from ckptd.cache.remote.client import RemoteClient
from ckptd.cache.remote.layout import Layout
from ckptd.cache.remote.publish import Chain, Known, Publisher, ReadValues

log = logging.getLogger(__name__)


class Uploader:
    def __init__(self, client: RemoteClient, layout: Layout, known: Known, chain: Chain,
                 read: ReadValues, block_size: int, block_bytes: int) -> None:
        self.client, self.cfg, self.B, self.G = client, client.config, block_size, layout.grid
        self.pool = ThreadPoolExecutor(self.cfg.concurrency, thread_name_prefix="ckptd-upload")
        self.publisher = Publisher(client, layout, known, chain, read, block_size, block_bytes,
                                   self.pool, stopping=lambda: self.closed)
        self.cond = threading.Condition()
        self.queue: deque[tuple[bytes, EntryMeta, int]] = deque()   # key, meta, stored bytes
        self.pending: dict[bytes, tuple[EntryMeta, float, int]] = {}  # state -> meta, since
        self.active = 0                      # entries in the batch going up now
        self.queued_bytes = 0                # stored bytes waiting (on disk, not in RAM)
        self.last_offer = 0.0
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
            self.last_offer = time.monotonic()
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
                cells, states, quiet = self._take()
                self.active = len(cells) + len(states)
            done = states
            try:
                done = self._batch(cells, states, quiet)
            except Exception:                  # counted as failed; the thread never dies
                log.exception("remote: an upload batch failed")
                with self.publisher.lock:
                    self.publisher.counts.failed += len(states)
            finally:
                with self.cond:
                    self.active = 0
                    self.queued_bytes -= sum(s[-1] for s in done) + sum(c[-1] for c in cells)
                    self.cond.notify_all()

    def _due(self) -> bool:
        """Under the lock: whether a batch should go now."""
        if self.queue:
            return True
        if not self.pending:
            return False
        now = time.monotonic()
        return bool(self.flushing) or now - self.last_offer >= self.cfg.linger or \
            any(now - since >= self.cfg.max_linger for _, since, _ in self.pending.values())

    def _wait(self) -> float | None:
        if not self.pending:
            return None
        oldest = min(since for _, since, _ in self.pending.values())
        return max(0.01, min(self.last_offer + self.cfg.linger, oldest + self.cfg.max_linger)
                   - time.monotonic())

    def _take(self) -> tuple[list, list, bool]:
        """Under the lock: the cells the queue completes, every waiting state, and
        whether the commits have gone quiet."""
        cells = []
        now = time.monotonic()
        while self.queue:
            key, meta, size = self.queue.popleft()
            if meta.kind != BLOCK:
                self.pending[key] = (meta, now, size)
            elif (meta.position // self.B) % self.G == 0:
                cells.append((key, size))
            else:
                self.queued_bytes -= size      # read back with its cell's segment
        states = [(k, m, since, size) for k, (m, since, size) in self.pending.items()]
        self.pending.clear()
        quiet = bool(self.flushing or self.closed) or now - self.last_offer >= self.cfg.linger
        return cells, states, quiet

    def _batch(self, cells: list, states: list, quiet: bool) -> list:
        """Put the cells, and the states that are ready; the others wait again. Returns
        the states done with."""
        pub = self.publisher
        cell_jobs, full = pub.cells([k for k, _ in cells])
        now, ready, done, back = time.monotonic(), [], [], []
        for item in sorted(states, key=lambda s: -s[1].position):
            key, meta, since, _ = item
            d = meta.position // self.B
            # A state in a cell still filling waits, unless this batch fills its cell
            # on its chain (its parent block is in that cell): then it names that
            # cell's segment rather than a segment of its own.
            if not (quiet or d % self.G == 0 or meta.parent in full
                    or now - since >= self.cfg.max_linger):
                back.append(item)
                continue
            done.append(item)
            job = pub.state_job(key, meta)
            if job is None:
                with pub.lock:
                    pub.counts.evicted += 1
            else:
                ready.append(job)
        if back:
            with self.cond:
                for key, meta, since, size in back:
                    self.pending[key] = (meta, since, size)
        pub.run(cell_jobs, ready)
        return done

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

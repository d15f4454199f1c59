"""Write-behind: puts are encoded on a small pool as they arrive and committed to disk
in batches, in order, by one thread, so compression overlaps the LMDB commits.

The queue is bounded in bytes. When a put does not fit, it sheds: queued items of a
lower priority (interval snapshots: the first thinned anyway) leave the queue,
oldest first, until it fits; failing that the put itself is dropped. Blocks and end
or branch snapshots (priority 1) may use the bound twice over before they are
dropped, so a burst of them is not lost to a queue that interval snapshots filled.
Every shed write is counted by what it was (its label) and a burst is logged once;
a decode loop never waits on disk. With block=True a put waits for room instead.
`flush()` returns once everything put before it is on disk (or failed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger(__name__)
LOG_EVERY_S = 10.0          # a burst of shed writes is logged once per this many seconds
HIGH_SLACK = 2              # priority >= 1 may fill the queue to this many times the bound


@dataclass(eq=False)
class _Queued:
    seq: int
    encoding: Future
    nbytes: int
    counted: bool             # an entry (False: a delete), for the committed / failed counts
    priority: int
    label: str
    item: object


class Writer:
    def __init__(self, encode: Callable, commit: Callable[[list], int], max_queue_bytes: int,
                 threads: int = 2, batch: int = 64, block: bool = False,
                 on_shed: Callable[[object], None] | None = None) -> None:
        """on_shed(item): called (under no lock of the writer's) for a queued item shed
        to make room for another."""
        if max_queue_bytes <= 0:
            raise ValueError(f"write queue bound must be positive, got {max_queue_bytes}")
        self.encode, self.commit, self.on_shed = encode, commit, on_shed
        self.max_bytes, self.batch, self.block = max_queue_bytes, batch, block
        self.queue: deque[_Queued] = deque()
        self.queued_bytes = 0             # queued or being committed
        self.next_seq = 0
        self.pending = 0                  # items taken from the queue, not yet finished
        self.committed = self.failed = 0
        self.shed: Counter[str] = Counter()   # writes not made, by label
        self._unlogged: Counter[str] = Counter()
        self._logged_at = 0.0
        self.closed = False
        self.cond = threading.Condition()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="ckptd-encode")
        self.thread = threading.Thread(target=self._loop, name="ckptd-writer", daemon=True)
        self.thread.start()

    @property
    def dropped(self) -> int:
        return sum(self.shed.values())

    def put(self, item, nbytes: int, counted: bool = True, priority: int = 1,
            label: str = "entry") -> bool:
        """Queue one item; False when it was dropped (no room, or closed). An item that
        is not an entry (a delete) passes counted=False: it is left out of the committed
        / failed counts. priority: what may be shed for it (anything lower)."""
        shed: list[_Queued] = []
        with self.cond:
            if self.block:
                # An item bigger than the whole bound still goes in once the queue is empty.
                self.cond.wait_for(lambda: self.closed or not self.queued_bytes
                                   or self.queued_bytes + nbytes <= self.max_bytes)
            bound = self.max_bytes * (HIGH_SLACK if priority >= 1 else 1)
            if not self.closed and self._over(nbytes, bound):
                shed = self._make_room(nbytes, priority, bound)
            if self.closed or self._over(nbytes, bound):
                self._count(label)
                ok = False
            else:
                self.queue.append(_Queued(self.next_seq, self.pool.submit(self.encode, item),
                                          nbytes, counted, priority, label, item))
                self.next_seq += 1
                self.queued_bytes += nbytes
                self.cond.notify_all()
                ok = True
        for q in shed:
            q.encoding.cancel()
            if self.on_shed is not None:
                self.on_shed(q.item)
        self._log_burst()
        return ok

    def _over(self, nbytes: int, bound: int) -> bool:
        return bool(self.queued_bytes) and self.queued_bytes + nbytes > bound

    def _make_room(self, nbytes: int, priority: int, bound: int) -> list[_Queued]:
        """Take lower-priority items out of the queue, lowest and oldest first, until
        nbytes fit under `bound` (only if that is enough). Under the lock."""
        lower = sorted((q for q in self.queue if q.priority < priority and q.counted),
                       key=lambda q: (q.priority, q.seq))
        need = self.queued_bytes + nbytes - bound
        if sum(q.nbytes for q in lower) < need:
            return []
        out, freed = [], 0
        for q in lower:
            if freed >= need:
                break
            out.append(q)
            freed += q.nbytes
        gone = set(map(id, out))
        self.queue = deque(q for q in self.queue if id(q) not in gone)
        self.queued_bytes -= freed
        for q in out:
            self._count(q.label)
        # their sequence numbers are skipped: flush() waits for the last one queued
        return out

    def _count(self, label: str) -> None:
        self.shed[label] += 1
        self._unlogged[label] += 1

    def _log_burst(self) -> None:
        with self.cond:
            now = time.monotonic()
            if not self._unlogged or now - self._logged_at < LOG_EVERY_S:
                return
            what = ", ".join(f"{n} {label}" for label, n in sorted(self._unlogged.items()))
            self._unlogged.clear()
            self._logged_at = now
        log.warning("cache: the disk writer fell behind; writes shed (kept in RAM only): %s "
                    "(more are counted in /metrics, not logged, for %.0f s)", what, LOG_EVERY_S)

    def _loop(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.queue or self.closed)
                if not self.queue:
                    return
                take = [self.queue.popleft() for _ in range(min(self.batch, len(self.queue)))]
                self.pending = len(take)
            ok = 0
            uncounted = sum(1 for t in take if not t.counted)
            try:
                encoded = []
                for q in take:
                    try:
                        encoded.append(q.encoding.result())
                    except Exception:
                        log.exception("cache writer: could not encode an entry")
                ok = len(encoded) - self.commit(encoded)     # commit returns entries it lost
            except Exception:   # a failed batch is counted, never fatal to the process
                log.exception("cache writer: dropped a batch of %d entries", len(take))
            ok = max(0, ok - uncounted)
            with self.cond:
                self.committed += ok
                self.failed += len(take) - uncounted - ok
                self.queued_bytes -= sum(t.nbytes for t in take)
                self.pending = 0
                self.cond.notify_all()

    @property
    def depth(self) -> int:
        with self.cond:
            return len(self.queue) + self.pending

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything put before this call is committed (or failed)."""
        with self.cond:
            target = self.next_seq - 1      # shed items leave gaps: wait for what is left
            return self.cond.wait_for(lambda: not self.pending and
                                      not any(q.seq <= target for q in self.queue), timeout)

    def close(self) -> None:
        self.flush()
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join()
        self.pool.shutdown()

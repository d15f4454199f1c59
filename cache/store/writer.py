"""Write-behind: puts are encoded on a small pool as they arrive and committed to disk
in batches, in order, by one thread, so compression overlaps the LMDB commits.

The queue is bounded in bytes. When it is full a put is dropped and counted (the
default: a decode loop never waits on disk) or, with block=True, waits for room.
`flush()` returns once everything put before it is on disk (or failed).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger(__name__)


class Writer:
    def __init__(self, encode: Callable, commit: Callable[[list], int], max_queue_bytes: int,
                 threads: int = 2, batch: int = 64, block: bool = False) -> None:
        if max_queue_bytes <= 0:
            raise ValueError(f"write queue bound must be positive, got {max_queue_bytes}")
        self.encode, self.commit = encode, commit
        self.max_bytes, self.batch, self.block = max_queue_bytes, batch, block
        # (seq, encoding, nbytes, counted)
        self.queue: deque[tuple[int, Future, int, bool]] = deque()
        self.queued_bytes = 0             # queued or being committed
        self.next_seq = 0
        self.done_seq = -1                # every put with seq <= done_seq is finished
        self.pending = 0                  # items taken from the queue, not yet finished
        self.dropped = self.committed = self.failed = 0
        self.closed = False
        self.cond = threading.Condition()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="ckptd-encode")
        self.thread = threading.Thread(target=self._loop, name="ckptd-writer", daemon=True)
        self.thread.start()

    def put(self, item, nbytes: int, counted: bool = True) -> bool:
        """Queue one item; False when it was dropped (queue full, or closed). An item
        that is not an entry (a delete) passes counted=False: it is left out of the
        committed / failed counts."""
        with self.cond:
            if self.block:
                # An item bigger than the whole bound still goes in once the queue is empty.
                self.cond.wait_for(lambda: self.closed or not self.queued_bytes
                                   or self.queued_bytes + nbytes <= self.max_bytes)
            if self.closed or (self.queued_bytes and self.queued_bytes + nbytes > self.max_bytes):
                self.dropped += 1
                return False
            self.queue.append((self.next_seq, self.pool.submit(self.encode, item), nbytes,
                               counted))
            self.next_seq += 1
            self.queued_bytes += nbytes
            self.cond.notify_all()
            return True

    def _loop(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.queue or self.closed)
                if not self.queue:
                    return
                take = [self.queue.popleft() for _ in range(min(self.batch, len(self.queue)))]
                self.pending = len(take)
            ok = 0
            uncounted = sum(1 for t in take if not t[3])
            try:
                encoded = []
                for _, fut, _, _ in take:
                    try:
                        encoded.append(fut.result())
                    except Exception:
                        log.exception("cache writer: could not encode an entry")
                ok = len(encoded) - self.commit(encoded)     # commit returns entries it lost
            except Exception:   # a failed batch is counted, never fatal to the process
                log.exception("cache writer: dropped a batch of %d entries", len(take))
            ok = max(0, ok - uncounted)
            with self.cond:
                self.committed += ok
                self.failed += len(take) - uncounted - ok
                self.queued_bytes -= sum(t[2] for t in take)
                self.done_seq = take[-1][0]
                self.pending = 0
                self.cond.notify_all()

    @property
    def depth(self) -> int:
        with self.cond:
            return len(self.queue) + self.pending

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything put before this call is committed (or failed)."""
        with self.cond:
            target = self.next_seq - 1
            return self.cond.wait_for(lambda: self.done_seq >= target, timeout)

    def close(self) -> None:
        self.flush()
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join()
        self.pool.shutdown()

"""Write-behind: puts are queued and committed to disk in batches by one thread.

The queue is bounded in bytes; a put that does not fit is dropped and counted
(the caller, a decode loop, never waits on disk). Compression runs on a small
pool; `flush()` returns once everything queued before it is committed.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


class Writer:
    def __init__(self, commit: Callable[[list], None], encode: Callable, max_queue_bytes: int,
                 threads: int = 2, batch: int = 64) -> None:
        self.commit = commit
        self.encode = encode
        self.max_bytes = max_queue_bytes
        self.batch = batch
        self.queue: deque = deque()
        self.queued_bytes = 0
        self.dropped = 0
        self.committed = 0
        self.failed = 0
        self.pending = 0               # taken from the queue, not yet committed
        self.cond = threading.Condition()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="ckptd-zstd")
        self.closed = False
        self.thread = threading.Thread(target=self._loop, name="ckptd-writer", daemon=True)
        self.thread.start()

    def put(self, item, nbytes: int) -> bool:
        with self.cond:
            if self.closed or self.queued_bytes + nbytes > self.max_bytes:
                self.dropped += 1
                return False
            self.queue.append((item, nbytes))
            self.queued_bytes += nbytes
            self.cond.notify_all()
            return True

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closed:
                    self.cond.wait()
                if not self.queue and self.closed:
                    return
                take = [self.queue.popleft() for _ in range(min(self.batch, len(self.queue)))]
                self.pending = len(take)
            try:
                encoded = list(self.pool.map(self.encode, [item for item, _ in take]))
                self.commit(encoded)
                ok = len(take)
            except Exception:  # a failed batch (disk full) is counted, never fatal
                ok = 0
            with self.cond:
                self.committed += ok
                self.failed += len(take) - ok
                self.queued_bytes -= sum(n for _, n in take)
                self.pending = 0
                self.cond.notify_all()

    @property
    def depth(self) -> int:
        return len(self.queue) + self.pending

    def flush(self, timeout: float | None = None) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: not self.queue and not self.pending, timeout)

    def close(self) -> None:
        self.flush()
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join()
        self.pool.shutdown()

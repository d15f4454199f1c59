"""Write-behind to the remote: entries go up after they commit to LMDB, never before,
and nothing that serves a request waits for them.

`offer()` is called by the disk writer after each commit (cache/store/commit.py) and
returns at once. The queue holds keys, not values: a worker reads the value back
from LMDB when its turn comes (`read`), so a backlog costs ~100 bytes an entry of
RAM, not the state itself (a long context of a real model is gigabytes, and the
remote may be far slower than the disk). The queue is bounded in entries; beyond
it an entry is dropped and counted, as is one evicted from LMDB before its turn.
Workers, as many as the remote's concurrency, take entries in commit order
(parents before their children, so what is on the remote is mostly a closed
prefix, as the lookup's search assumes), check the value's checksum, put the value
object, then a snapshot's marker. A failed put waits `backoff`, doubling, and tries
again up to `upload_attempts` times, counted; while the remote is in its cool-off
(cache/remote/client.py) workers wait instead of spending attempts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from ckptd.cache import codec
from ckptd.cache.entry import SNAPSHOT, EntryMeta
from ckptd.cache.remote.client import RemoteClient, RemoteError
from ckptd.cache.remote.layout import Layout, pack

log = logging.getLogger(__name__)
Read = Callable[[bytes, str], "tuple[EntryMeta, bytes] | None"]


class Uploader:
    def __init__(self, client: RemoteClient, layout: Layout, read: Read) -> None:
        """read(key, kind): the committed entry's meta and LMDB value, None when gone."""
        self.client, self.layout, self.cfg, self.read = client, layout, client.config, read
        self.queue: deque[tuple[bytes, str, int]] = deque()     # key, kind, stored bytes
        self.queued_bytes = 0                 # stored bytes waiting (on disk, not in RAM)
        self.active = 0                       # entries being uploaded now
        self.uploaded = self.exists = self.retries = self.failed = self.dropped = 0
        self.evicted = 0                      # gone from LMDB (or bad there) before their turn
        self.uploaded_bytes = 0
        self.closed = False
        self.cond = threading.Condition()
        self.workers = [threading.Thread(target=self._work, name=f"ckptd-upload-{i}",
                                         daemon=True) for i in range(self.cfg.concurrency)]
        for t in self.workers:
            t.start()

    def offer(self, items: Sequence[tuple[bytes, EntryMeta, bytes]]) -> int:
        """Queue committed entries (key, meta, LMDB value) for upload; returns how many
        were taken. Never blocks."""
        taken = 0
        with self.cond:
            for key, meta, blob in items:
                if self.closed or len(self.queue) >= self.cfg.queue_entries:
                    self.dropped += 1
                    continue
                self.queue.append((key, meta.kind, len(blob)))
                self.queued_bytes += len(blob)
                taken += 1
            self.cond.notify_all()
        return taken

    def _work(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.queue or self.closed)
                if not self.queue:
                    return
                key, kind, size = self.queue.popleft()
                self.active += 1
            try:
                self._one(key, kind)
            except Exception:                  # counted below; a worker never dies
                log.exception("remote: upload failed")
                with self.cond:
                    self.failed += 1
            finally:
                with self.cond:
                    self.active -= 1
                    self.queued_bytes -= size
                    self.cond.notify_all()

    def _one(self, key: bytes, kind: str) -> None:
        found = self.read(key, kind)
        if found is not None:
            try:
                codec.verify(found[1], self.layout.fp, key)
            except codec.CorruptValue:        # the disk's damage stays off the remote
                found = None
        if found is None:
            with self.cond:
                self.evicted += 1
            return
        self._upload(key, *found)

    def _upload(self, key: bytes, meta: EntryMeta, blob: bytes) -> None:
        steps = [(self.layout.value(key, meta.kind), pack(meta, blob))]
        if meta.kind == SNAPSHOT:             # after the value: a marker finds a value
            steps.append((self.layout.marker(meta.parent, key), b""))
        delay, attempt, first = self.cfg.backoff, 0, True
        while steps:
            attempt += 1
            self._wait_available()
            name, body = steps[0]
            try:
                written = self.client.put(name, body)
            except RemoteError as e:
                # Refused (403, a bad request) is not going to change by retrying.
                if self.closed or attempt >= self.cfg.upload_attempts \
                        or e.kind in ("denied", "client"):
                    with self.cond:
                        self.failed += 1
                    return
                with self.cond:
                    self.retries += 1
                    self.cond.wait_for(lambda: self.closed, delay)   # close() wakes it
                delay *= 2
                continue
            if first:
                with self.cond:
                    if written:
                        self.uploaded += 1
                        self.uploaded_bytes += len(body)
                    else:
                        self.exists += 1
                first = False
            steps.pop(0)

    def _wait_available(self) -> None:
        while not self.client.available() and not self.closed:
            time.sleep(0.05)

    @property
    def depth(self) -> int:
        with self.cond:
            return len(self.queue) + self.active

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every entry offered so far is uploaded (or failed)."""
        with self.cond:
            return self.cond.wait_for(lambda: not self.queue and not self.active, timeout)

    def close(self) -> None:
        """Give the queue close_timeout seconds to go up, unless the remote is failing
        (a daemon stops promptly), then drop what is left."""
        deadline = time.monotonic() + self.cfg.close_timeout
        with self.cond:
            while (self.queue or self.active) and self.client.available():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(min(left, 0.1))
        with self.cond:
            self.closed = True
            self.dropped += len(self.queue)
            self.queue.clear()
            self.cond.notify_all()
        # A worker stuck in a request to a hung remote is a daemon thread: the process
        # may exit under it (an S3 put is whole or nothing).
        end = time.monotonic() + 2.0
        for t in self.workers:
            t.join(max(0.0, end - time.monotonic()))

    def stats(self) -> dict:
        with self.cond:
            return {"depth": len(self.queue) + self.active, "bytes": self.queued_bytes,
                    "bound_entries": self.cfg.queue_entries, "evicted": self.evicted,
                    "uploaded": self.uploaded,
                    "uploaded_bytes": self.uploaded_bytes, "exists": self.exists,
                    "retries": self.retries, "failed": self.failed, "dropped": self.dropped}

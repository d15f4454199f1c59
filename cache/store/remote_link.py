"""The store's side of the remote tier (cache/remote/): what the uploader reads back
from LMDB, and what a restore read from the remote, kept locally."""

from __future__ import annotations

import threading

from ckptd.cache.entry import EntryMeta
from ckptd.cache.store.catalog import Catalog
from ckptd.cache.store.commit import Fetched
from ckptd.cache.store.writer import Writer
from ckptd.cache.tiers.disk import DiskTier
from ckptd.cache.tiers.host import HostTier


class RemoteLink:
    def __init__(self, catalog: Catalog, host: HostTier, disk: DiskTier, writer: Writer | None,
                 put_lock: threading.Lock) -> None:
        """writer: None for a read-only store (nothing read from the remote is kept)."""
        self.catalog, self.host, self.disk = catalog, host, disk
        self.writer, self.put_lock = writer, put_lock

    def committed(self, key: bytes, kind: str) -> tuple[EntryMeta, bytes] | None:
        """A committed entry's meta and LMDB value (None once it is gone)."""
        with self.catalog.lock:
            meta = self.catalog.index.get(key)
        if meta is None:
            return None
        blob = self.disk.read_many([(key, kind)], lambda k, b: None if b is None else bytes(b))
        return None if blob[0] is None else (meta, blob[0])

    def adopt(self, items: list[tuple[bytes, EntryMeta, bytes, dict | None]]) -> None:
        """Keep what a restore read from the remote: in LMDB through the write-behind
        queue (as it is: not encoded again, not uploaded back), a snapshot in RAM too."""
        if self.writer is None:
            return
        cat = self.catalog
        for key, meta, blob, tensors in items:
            if cat.known(key):
                continue
            if tensors is not None:
                self.host.put(key, meta, {k: v.clone() for k, v in tensors.items()})
            with self.put_lock:
                with cat.lock:
                    cat.queued[key] = meta.parent
                # Outside the byte bound: the value is in memory already and costs no
                # encoding (a 300 MB context read back must not be mostly dropped).
                if not self.writer.put(Fetched(key, meta, blob), 0):
                    with cat.lock:
                        cat.queued.pop(key, None)

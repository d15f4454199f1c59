"""The store's side of the remote tier: what an upload reads (a block's chain, values)
from LMDB, and what a restore read from the remote, kept locally."""

from __future__ import annotations

import threading

from ckptd.cache.entry import BLOCK, EntryMeta
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

    def chain(self, key: bytes) -> tuple[bytes, list[bytes]] | None:
        """(the root key, the keys of blocks 0 .. `key`) as the index has them; None
        when a block of the prefix is gone (evicted)."""
        cat = self.catalog
        keys = []
        with cat.lock:
            meta = cat.index.get(key)
            while meta is not None and meta.kind == BLOCK:
                keys.append(key)
                if not meta.has_block_parent:
                    return meta.parent, keys[::-1]
                key = meta.parent
                meta = cat.index.get(key)
        return None

    def values(self, items: list[tuple[bytes, str]]) -> list[bytes | None]:
        """Committed LMDB values (None where one is gone)."""
        return self.disk.read_many(items, lambda k, b: None if b is None else bytes(b))

    def adopt(self, items: list[tuple[bytes, EntryMeta, bytes, dict | None]]) -> None:
        """Keep what a restore read from the remote: in LMDB through the write-behind
        queue (as it is: not encoded again, not uploaded back), a snapshot in RAM too
        (its tensors are the store's: the reader copied them)."""
        if self.writer is None:
            return
        cat = self.catalog
        for key, meta, blob, tensors in items:
            if cat.known(key):
                continue
            if tensors is not None:
                self.host.put(key, meta, tensors)
            with self.put_lock:
                with cat.lock:
                    cat.queued[key] = meta.parent
                # Outside the byte bound: the value is in memory already and costs no
                # encoding (a 300 MB context read back must not be mostly dropped).
                if not self.writer.put(Fetched(key, meta, blob), 0):
                    with cat.lock:
                        cat.queued.pop(key, None)

"""The store's side of the remote tier (cache/remote/): what the uploader reads back
from LMDB, and what a restore read from the remote, kept locally."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckptd.cache.entry import BLOCK, EntryMeta
from ckptd.cache.store.commit import Fetched

if TYPE_CHECKING:
    from ckptd.cache.remote.tier import RemoteTier
    from ckptd.cache.store.store import CacheStore


class RemoteLink:
    def __init__(self, store: CacheStore, remote: RemoteTier) -> None:
        self.store, self.remote = store, remote

    def chain(self, key: bytes) -> tuple[bytes, list[bytes]] | None:
        """(the root key, the keys of blocks 0 .. `key`) as the index has them; None
        when a block of the prefix is gone (evicted)."""
        cat = self.store.catalog
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
        return self.store.disk.read_many(items, lambda k, b: None if b is None else bytes(b))

    def adopt(self, items: list[tuple[bytes, EntryMeta, bytes, dict | None]]) -> None:
        """Keep what a restore read from the remote: in LMDB through the write-behind
        queue (as it is: not encoded again, not uploaded back), a snapshot in RAM too
        (its tensors are the store's: the reader copied them)."""
        s = self.store
        if s.readonly:
            return
        cat = s.catalog
        for key, meta, blob, tensors in items:
            if cat.known(key):
                continue
            if tensors is not None:
                s.host.put(key, meta, tensors)
            with s.put_lock:
                with cat.lock:
                    cat.queued[key] = meta.parent
                # Outside the byte bound: the value is in memory already and costs no
                # encoding (a 300 MB context read back must not be mostly dropped).
                if not s.writer.put(Fetched(key, meta, blob), 0):
                    with cat.lock:
                        cat.queued.pop(key, None)

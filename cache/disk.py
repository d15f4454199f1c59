"""The disk tier: LMDB, which is also the index (so a restart finds everything).

Sub-databases:
    values  key -> codec blob
    meta    key -> EntryMeta JSON
    snaps   parent key ‖ tail length (u32 big-endian) -> snapshot key, so the
            snapshots after a block are one range scan
    info    store-wide settings (format version)

A value becomes visible only in a committed transaction together with its meta.
"""

from __future__ import annotations

import struct
from pathlib import Path

import lmdb

from cache.entry import SNAPSHOT, EntryMeta
from cache.keys import FORMAT_VERSION

_MIN_MAP = 64 << 20


class DiskFull(RuntimeError):
    """The map cannot grow within the disk budget: the batch is not written."""


class DiskTier:
    def __init__(self, path: str | Path, budget_bytes: int, readonly: bool = False) -> None:
        path = Path(path)
        self.readonly = readonly
        self.budget = budget_bytes
        if readonly:
            if not (path / "data.mdb").exists():
                raise FileNotFoundError(f"no cache store at {path}")
        else:
            path.mkdir(parents=True, exist_ok=True)
        # Map size: room for the budget plus LMDB's own overhead (free pages, tree nodes).
        self.max_map = max(_MIN_MAP, int(budget_bytes * 1.5) + _MIN_MAP)
        self.env = lmdb.open(str(path), map_size=min(self.max_map, 256 << 20), max_dbs=4,
                             readonly=readonly, lock=True, readahead=False)
        self.values = self.env.open_db(b"values", create=not readonly)
        self.meta_db = self.env.open_db(b"meta", create=not readonly)
        self.snaps = self.env.open_db(b"snaps", create=not readonly)
        self.info = self.env.open_db(b"info", create=not readonly)
        if not readonly:
            self._check_format()

    def _check_format(self) -> None:
        with self.env.begin(write=True, db=self.info) as txn:
            found = txn.get(b"format")
            if found is not None and int(found) != FORMAT_VERSION:
                # Another format's values are never served: start over.
                for db in (self.values, self.meta_db, self.snaps):
                    txn.drop(db, delete=False)
            txn.put(b"format", str(FORMAT_VERSION).encode())

    @staticmethod
    def _snap_index(meta: EntryMeta, key: bytes) -> bytes:
        return bytes.fromhex(meta.parent) + struct.pack(">I", len(meta.tokens))

    def put_many(self, items: list[tuple[bytes, EntryMeta, bytes]]) -> int:
        """Commit items in one transaction, growing the map as needed. An item whose parent
        is neither stored nor earlier in the batch is skipped (it was evicted meanwhile: a
        prefix stays closed). Returns the net stored bytes added."""
        while True:
            try:
                added = 0
                with self.env.begin(write=True) as txn:
                    present: set[bytes] = set()
                    for key, meta, blob in items:
                        parent = bytes.fromhex(meta.parent)
                        if _has_parent(meta) and parent not in present \
                                and txn.get(parent, db=self.meta_db) is None:
                            continue
                        old = txn.get(key, db=self.meta_db)
                        if old is not None:
                            added -= EntryMeta.from_bytes(old).stored_bytes
                        txn.put(key, blob, db=self.values)
                        txn.put(key, meta.to_bytes(), db=self.meta_db)
                        if meta.kind == SNAPSHOT:
                            txn.put(self._snap_index(meta, key), key, db=self.snaps)
                        added += meta.stored_bytes
                        present.add(key)
                return added
            except lmdb.MapFullError:
                size = self.env.info()["map_size"]
                if size >= self.max_map:
                    raise DiskFull(f"store map is full at {size} bytes") from None
                self.env.set_mapsize(min(self.max_map, size * 2))

    def get(self, key: bytes) -> bytes | None:
        with self.env.begin(db=self.values, buffers=False) as txn:
            return txn.get(key)

    def meta(self, key: bytes) -> EntryMeta | None:
        with self.env.begin(db=self.meta_db) as txn:
            data = txn.get(key)
        return None if data is None else EntryMeta.from_bytes(data)

    def contains(self, key: bytes) -> bool:
        with self.env.begin(db=self.meta_db) as txn:
            return txn.get(key) is not None

    def snapshots_after(self, parent: bytes) -> list[tuple[int, bytes]]:
        """(tail length, snapshot key) of every snapshot whose parent is `parent`."""
        out = []
        with self.env.begin(db=self.snaps) as txn:
            cur = txn.cursor()
            if cur.set_range(parent):
                for k, v in cur:
                    if not k.startswith(parent):
                        break
                    out.append((struct.unpack(">I", k[len(parent):])[0], bytes(v)))
        return out

    def delete_many(self, keys: list[bytes]) -> None:
        with self.env.begin(write=True) as txn:
            for key in keys:
                data = txn.get(key, db=self.meta_db)
                if data is None:
                    continue
                meta = EntryMeta.from_bytes(data)
                if meta.kind == SNAPSHOT:
                    txn.delete(self._snap_index(meta, key), db=self.snaps)
                txn.delete(key, db=self.values)
                txn.delete(key, db=self.meta_db)

    def update_meta(self, updates: dict[bytes, EntryMeta]) -> None:
        with self.env.begin(write=True, db=self.meta_db) as txn:
            for key, meta in updates.items():
                if txn.get(key) is not None:
                    txn.put(key, meta.to_bytes())

    def scan(self) -> list[tuple[bytes, EntryMeta]]:
        with self.env.begin(db=self.meta_db) as txn:
            return [(bytes(k), EntryMeta.from_bytes(v)) for k, v in txn.cursor()]

    def stored_bytes(self) -> int:
        return sum(m.stored_bytes for _, m in self.scan())

    def file_bytes(self) -> int:
        info, stat = self.env.info(), self.env.stat()
        return (info["last_pgno"] + 1) * stat["psize"]

    def clear(self) -> None:
        with self.env.begin(write=True) as txn:
            for db in (self.values, self.meta_db, self.snaps):
                txn.drop(db, delete=False)

    def close(self) -> None:
        self.env.close()


def _has_parent(meta: EntryMeta) -> bool:
    """False when the parent is a root key: the first block (its tokens are all the
    tokens so far), or a snapshot inside the first block (likewise)."""
    return meta.position != len(meta.tokens)

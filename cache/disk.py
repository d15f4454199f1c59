"""The disk tier: LMDB, which is also the persistent index (a restart finds everything).

Sub-databases:
    blocks     key -> codec blob of one KV page
    snapshots  key -> codec blob of one snapshot
    meta       key -> EntryMeta JSON (the index)
    info       store-wide settings (format version)

A value becomes visible only in a committed transaction together with its meta,
and a batch commits as one transaction, so a crash leaves whole entries or none.

The map is sized once, at open, to its maximum: on Linux that reserves address
space only (the file grows with the data). LMDB allows a resize only while no
transaction of this process is open, which the parallel readers can't promise.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import lmdb
import numpy as np

from cache.entry import BLOCK, EntryMeta
from cache.keys import FORMAT_VERSION

T = TypeVar("T")
_MIN_MAP = 1 << 20
_PAGE = mmap.PAGESIZE
_WILLNEED = getattr(mmap, "MADV_WILLNEED", None)
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if _WILLNEED else None


class DiskFull(RuntimeError):
    """The LMDB map is full: the batch was not written (the caller may evict and retry)."""


class DiskTier:
    name = "disk"

    def __init__(self, path: str | Path, map_bytes: int, readonly: bool = False) -> None:
        path = Path(path)
        self.path = path
        self.readonly = readonly
        if readonly:
            if not (path / "data.mdb").exists():
                raise FileNotFoundError(f"no cache store at {path}")
        else:
            path.mkdir(parents=True, exist_ok=True)
        # readahead stays on: a restore reads whole values front to back, and cold
        # reads with MADV_RANDOM fault in one 4 KiB page at a time.
        data = path / "data.mdb"
        if not readonly and data.exists():
            # A store that filled its map (say, the budget was cut) gets headroom back
            # on reopen: with no free pages LMDB can't even delete.
            size = data.stat().st_size
            map_bytes = max(map_bytes, size + size // 4 + _MIN_MAP)
        self.env = lmdb.open(str(path), map_size=max(_MIN_MAP, map_bytes), max_dbs=4,
                             readonly=readonly, lock=True, max_readers=256)
        names = (b"blocks", b"snapshots", b"meta", b"info")
        try:
            if readonly:
                dbs = [self.env.open_db(n, create=False) for n in names]
            else:
                # One transaction, so that a reader sees all four sub-databases or none.
                with self.env.begin(write=True) as txn:
                    dbs = [self.env.open_db(n, txn=txn) for n in names]
        except lmdb.NotFoundError:
            self.env.close()
            raise FileNotFoundError(f"cache store at {path} is not initialized yet") from None
        self.blocks, self.snapshots, self.meta_db, self.info = dbs
        if not readonly:
            self._check_format()

    def _check_format(self) -> None:
        with self.env.begin(write=True, db=self.info) as txn:
            found = txn.get(b"format")
            if found is not None and int(found) != FORMAT_VERSION:
                # Values of another format are never served: start over.
                for db in (self.blocks, self.snapshots, self.meta_db):
                    txn.drop(db, delete=False)
            txn.put(b"format", str(FORMAT_VERSION).encode())

    def _read(self, **kw) -> lmdb.Transaction:
        try:
            return self.env.begin(**kw)
        except lmdb.MapResizedError:
            # Another process (a writer with a bigger budget) grew the map: adopt it.
            self.env.set_mapsize(0)
            return self.env.begin(**kw)

    def _db(self, kind: str):
        return self.blocks if kind == BLOCK else self.snapshots

    # ---- reads ----------------------------------------------------------------------
    def read_many(self, items: Sequence[tuple[bytes, str]],
                  fn: Callable[[bytes, memoryview | None], T]) -> list[T]:
        """fn(key, value buffer or None) for each (key, kind), all in one read
        transaction; the buffer is only valid inside fn (no copy is made)."""
        with self._read(buffers=True) as txn:
            return [fn(key, txn.get(key, db=self._db(kind))) for key, kind in items]

    def prefetch(self, items: Sequence[tuple[bytes, str]]) -> None:
        """Ask the kernel to start reading these values now (madvise WILLNEED on their
        pages in the map). A cold restore then reads in large requests, ahead of the
        decoders, instead of one page fault at a time."""
        if _libc is None:
            return
        with self._read(buffers=True) as txn:
            for key, kind in items:
                buf = txn.get(key, db=self._db(kind))
                if buf is None or len(buf) == 0:
                    continue
                addr = np.frombuffer(buf, np.uint8).ctypes.data
                start = addr - addr % _PAGE
                _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(addr + len(buf) - start),
                              _WILLNEED)

    def get(self, key: bytes) -> bytes | None:
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        with self._read() as txn:
            out = []
            for key in keys:
                value = txn.get(key, db=self.blocks)
                out.append(value if value is not None else txn.get(key, db=self.snapshots))
            return out

    def meta(self, key: bytes) -> EntryMeta | None:
        with self._read(db=self.meta_db) as txn:
            data = txn.get(key)
        return None if data is None else EntryMeta.from_bytes(data)

    def contains(self, key: bytes) -> bool:
        with self._read(db=self.meta_db) as txn:
            return txn.get(key) is not None

    def scan(self) -> list[tuple[bytes, EntryMeta]]:
        with self._read(db=self.meta_db) as txn:
            return [(bytes(k), EntryMeta.from_bytes(v)) for k, v in txn.cursor()]

    def file_bytes(self) -> int:
        info, stat = self.env.info(), self.env.stat()
        return (info["last_pgno"] + 1) * stat["psize"]

    def map_bytes(self) -> int:
        return self.env.info()["map_size"]

    # ---- writes ---------------------------------------------------------------------
    def put(self, key: bytes, meta: EntryMeta, value: bytes) -> bool:
        return bool(self.put_many([(key, meta, value)]))

    def put_many(self, items: Sequence[tuple[bytes, EntryMeta, bytes]],
                 updates: dict[bytes, EntryMeta] | None = None) -> list[bytes]:
        """Commit items and meta updates in one transaction; returns the keys written.
        An item already stored is skipped, and so is one whose parent block is neither
        stored nor earlier in the batch (evicted meanwhile: a prefix stays closed)."""
        written: list[bytes] = []
        present: set[bytes] = set()
        try:
            with self.env.begin(write=True) as txn:
                for key, meta, blob in items:
                    if txn.get(key, db=self.meta_db) is not None:
                        continue
                    if meta.has_block_parent and meta.parent not in present \
                            and txn.get(meta.parent, db=self.meta_db) is None:
                        continue
                    txn.put(key, blob, db=self._db(meta.kind))
                    txn.put(key, meta.to_bytes(), db=self.meta_db)
                    written.append(key)
                    present.add(key)
                for key, meta in (updates or {}).items():
                    if txn.get(key, db=self.meta_db) is not None:
                        txn.put(key, meta.to_bytes(), db=self.meta_db)
        except lmdb.MapFullError:
            raise DiskFull(f"LMDB map of {self.map_bytes()} bytes is full") from None
        return written

    def settle(self) -> None:
        """Commit an empty-ish transaction. LMDB reuses the pages a transaction freed only
        from the second transaction after it, so call this between evicting for room
        and retrying a write that found the map full."""
        try:
            with self.env.begin(write=True, db=self.info) as txn:
                txn.put(b"format", str(FORMAT_VERSION).encode())
        except lmdb.MapFullError:
            raise DiskFull(f"LMDB map of {self.map_bytes()} bytes is full") from None

    def update_meta(self, updates: dict[bytes, EntryMeta]) -> None:
        self.put_many([], updates)

    def delete(self, key: bytes) -> None:
        self.delete_many([key])

    def delete_many(self, keys: Sequence[bytes]) -> list[bytes]:
        """Delete entries in one transaction; returns the keys that were there."""
        gone = []
        try:
            with self.env.begin(write=True) as txn:
                for key in keys:
                    data = txn.get(key, db=self.meta_db)
                    if data is None:
                        continue
                    txn.delete(key, db=self._db(EntryMeta.from_bytes(data).kind))
                    txn.delete(key, db=self.meta_db)
                    gone.append(key)
        except lmdb.MapFullError:
            # A completely full map can't even delete (copy-on-write needs free pages).
            raise DiskFull(f"LMDB map of {self.map_bytes()} bytes is full") from None
        return gone

    def copy_to(self, path: str | Path) -> None:
        """A consistent, compacted copy of the whole store (a hot backup)."""
        Path(path).mkdir(parents=True, exist_ok=True)
        self.env.copy(str(path), compact=True)

    def close(self) -> None:
        self.env.close()

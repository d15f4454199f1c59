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

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import lmdb

from ckptd.cache.entry import BLOCK, EntryMeta
from ckptd.cache.keys import FORMAT_VERSION
from ckptd.cache.tiers import pagein
from ckptd.cache.tiers.lmdb_check import check_file
from ckptd.cache.tiers.probe import walk_fails

T = TypeVar("T")
log = logging.getLogger(__name__)
# What LMDB says when its own pages (not a value) are broken.
_DAMAGED = (lmdb.CorruptedError, lmdb.InvalidError, lmdb.PageNotFoundError,
            lmdb.BadTxnError, lmdb.IncompatibleError)
_MIN_MAP = 1 << 20
# Values this small are not paged in one by one before they are decoded: the call cost
# more than the fault it saves (a tiny model's 4 KiB block is one page), and a restore's
# read-ahead helper has asked for them already.
_PAGE_IN_MIN = 64 << 10


class DiskFull(RuntimeError):
    """The LMDB map is full: the batch was not written (the caller may evict and retry)."""


class DiskWriteFailed(DiskFull):
    """The filesystem refused a write (no space left, a file size limit, an I/O error).
    LMDB aborts the transaction and stays usable, so this is handled like a full map:
    evicting frees pages inside the file that the retry can reuse without growing it."""


def _write_error(e: lmdb.Error, what: str) -> DiskFull:
    if isinstance(e, lmdb.MapFullError):
        return DiskFull(f"LMDB map of {what} bytes is full")
    return DiskWriteFailed(f"cache disk write failed: {e}")


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
        # The index as read at open, handed to the first scan() unless a write came
        # first: a damaged file must fail here, where it can be set aside, not later.
        self._at_open: list[tuple[bytes, EntryMeta]] | None = None
        if not readonly and (path / "data.mdb").exists():
            why = check_file(path) or walk_fails(path)
            if why is not None:
                aside = self._set_aside()
                log.error("cache: the store at %s is damaged (%s); moved to %s, starting "
                          "empty", path, why, aside)
        try:
            self._open(map_bytes)
            if not readonly:
                self._check_format()
                self._purge_damaged()
                self._at_open = self.scan()
        except _DAMAGED as e:
            if readonly:
                raise
            # LMDB's own pages are broken: nothing in the file can be trusted. The
            # cache can always be recomputed, so keep the file aside and start empty.
            aside = self._set_aside()
            log.error("cache: the store at %s is damaged (%s); moved to %s, starting empty",
                      path, e, aside)
            self._open(map_bytes)
            self._check_format()

    def _open(self, map_bytes: int) -> None:
        path, readonly = self.path, self.readonly
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
        except lmdb.Error:
            self.env.close()
            raise
        self.blocks, self.snapshots, self.meta_db, self.info = dbs

    def _set_aside(self) -> Path:
        try:
            self.env.close()
        except (lmdb.Error, AttributeError):
            pass
        aside = self.path / f"damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        aside.mkdir()
        for name in ("data.mdb", "lock.mdb"):
            if (self.path / name).exists():
                os.replace(self.path / name, aside / name)
        return aside

    def _check_format(self) -> None:
        with self.env.begin(write=True, db=self.info) as txn:
            found = txn.get(b"format")
            if found is not None and found != str(FORMAT_VERSION).encode():
                # Values of another format (or a damaged record of it) are never
                # served: start over.
                for db in (self.blocks, self.snapshots, self.meta_db):
                    txn.drop(db, delete=False)
            txn.put(b"format", str(FORMAT_VERSION).encode())

    def _purge_damaged(self) -> None:
        """Delete entries whose meta does not parse (a damaged record): the lookup never
        plans them, and what hung below them can no longer be reached from a root, so
        it ages out through eviction. Reading every meta also walks LMDB's pages."""
        bad: list[bytes] = []
        self.scan(bad)
        if bad:
            log.warning("cache: %d entries with a damaged index record dropped", len(bad))
            try:
                self.delete_many(bad)
            except DiskFull as e:
                log.warning("cache: could not delete the damaged entries: %s", e)

    def _read(self, **kw) -> lmdb.Transaction:
        try:
            return self.env.begin(**kw)
        except lmdb.MapResizedError:
            # Another process (a writer with a bigger budget) grew the map: adopt it.
            self.env.set_mapsize(0)
            return self.env.begin(**kw)

    def _db(self, kind: str):
        return self.blocks if kind == BLOCK else self.snapshots

    def read_many(self, items: Sequence[tuple[bytes, str]],
                  fn: Callable[[bytes, memoryview | None], T]) -> list[T]:
        """fn(key, value buffer or None) for each (key, kind), all in one read
        transaction; the buffer is only valid inside fn (no copy is made). Each value
        is paged in before fn sees it, with the GIL released: a cold read then waits
        for the disk without stopping the other reader threads' Python work."""
        out = []
        with self._read(buffers=True) as txn:
            for key, kind in items:
                buf = txn.get(key, db=self._db(kind))
                if buf is not None:
                    pagein.read_now(buf)
                out.append(fn(key, buf))
        return out

    def read_batch(self, items: Sequence[tuple[bytes, str]],
                   fn: Callable[[list[tuple[bytes, memoryview | None]]], list[T]]) -> list[T]:
        """fn over all the (key, value buffer or None) of items at once, in one read
        transaction (the buffers are valid only inside fn), paged in as read_many's."""
        with self._read(buffers=True) as txn:
            got = [(key, txn.get(key, db=self._db(kind))) for key, kind in items]
            for _, buf in got:
                if buf is not None and len(buf) >= _PAGE_IN_MIN:
                    pagein.read_now(buf)
            return fn(got)

    def prefetch(self, items: Sequence[tuple[bytes, str]]) -> None:
        """Ask the kernel to start reading these values, in this order (madvise
        WILLNEED on their pages in the map). Blocks about as long as the reads take,
        so a restore runs it beside the decoders: the disk then reads in large
        requests ahead of them instead of one page fault at a time."""
        try:
            with self._read(buffers=True) as txn:
                for key, kind in items:
                    buf = txn.get(key, db=self._db(kind))
                    if buf is not None:
                        pagein.willneed(buf)
        except _DAMAGED:
            pass                # only a hint: the read that follows reports the damage

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

    def scan(self, bad: list[bytes] | None = None) -> list[tuple[bytes, EntryMeta]]:
        """Every entry's meta. One that does not parse (a damaged file) is left out, and
        its key appended to `bad`: a damaged index entry must not stop the store."""
        if self._at_open is not None and bad is None:
            out, self._at_open = self._at_open, None
            return out
        out = []
        with self._read(db=self.meta_db) as txn:
            for k, v in txn.cursor():
                try:
                    out.append((bytes(k), EntryMeta.from_bytes(v)))
                except ValueError:
                    if bad is not None:
                        bad.append(bytes(k))
        return out

    def file_bytes(self) -> int:
        info, stat = self.env.info(), self.env.stat()
        return (info["last_pgno"] + 1) * stat["psize"]

    def map_bytes(self) -> int:
        return self.env.info()["map_size"]

    def put(self, key: bytes, meta: EntryMeta, value: bytes) -> bool:
        return bool(self.put_many([(key, meta, value)]))

    def put_many(self, items: Sequence[tuple[bytes, EntryMeta, bytes]],
                 updates: dict[bytes, EntryMeta] | None = None) -> list[bytes]:
        """Commit items and meta updates in one transaction; returns the keys written.
        An item already stored is skipped, and so is one whose parent block is neither
        stored nor earlier in the batch (evicted meanwhile: a prefix stays closed)."""
        self._at_open = None
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
        except lmdb.Error as e:
            raise _write_error(e, str(self.map_bytes())) from None
        return written

    def commit_empty(self) -> None:
        """Commit an empty-ish transaction. LMDB reuses the pages a transaction freed only
        from the second transaction after it, so call this between evicting for room
        and retrying a write that found the map full."""
        try:
            with self.env.begin(write=True, db=self.info) as txn:
                txn.put(b"format", str(FORMAT_VERSION).encode())
        except lmdb.Error as e:
            raise _write_error(e, str(self.map_bytes())) from None

    def update_meta(self, updates: dict[bytes, EntryMeta]) -> None:
        """Hit counts and last-used times: worth a try, not worth failing a close for."""
        try:
            self.put_many([], updates)
        except DiskFull as e:
            log.warning("cache: hit counts not saved: %s", e)

    def delete(self, key: bytes) -> None:
        self.delete_many([key])

    def delete_many(self, keys: Sequence[bytes]) -> list[bytes]:
        """Delete entries in one transaction; returns the keys that were there."""
        self._at_open = None
        gone = []
        try:
            with self.env.begin(write=True) as txn:
                for key in keys:
                    if txn.get(key, db=self.meta_db) is None:
                        continue
                    # Both value tables: the meta saying which may be the damaged part.
                    txn.delete(key, db=self.blocks)
                    txn.delete(key, db=self.snapshots)
                    txn.delete(key, db=self.meta_db)
                    gone.append(key)
        except lmdb.Error as e:
            # A completely full map (or disk) can't even delete: copy-on-write needs pages.
            raise _write_error(e, str(self.map_bytes())) from None
        return gone

    def copy_to(self, path: str | Path) -> None:
        """A consistent, compacted copy of the whole store (a hot backup)."""
        Path(path).mkdir(parents=True, exist_ok=True)
        self.env.copy(str(path), compact=True)

    def close(self) -> None:
        self.env.close()

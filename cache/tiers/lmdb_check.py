"""Checking the structure of an LMDB file before LMDB is trusted with it.

LMDB checksums nothing of its own: a flipped bit in a B-tree page or in the
free-page list is followed blindly, and LMDB's C code then aborts the process
(an assertion in mdb_freelist_save was seen on the first write after a start) or
silently hands a live page out again. ckptd's values carry their own checksums;
this module checks the rest, in pure Python (it can't crash the daemon), once at
open, while the daemon's lock keeps every writer out:

- both meta pages (magic, version, page size), the newer one as LMDB picks it;
- every tree (the free list, the main database, each named database): every page
  number inside the file and written in its own header, the page of the type its
  parent expects, node offsets inside the page, keys in order within their
  parent's bounds, every leaf at the recorded depth, the recorded page and entry
  counts, each overflow run as long as its value needs;
- the free list: keys are committed transaction ids in order, each page list
  descending, no page free twice or both free and in use.

Values are not read: a damaged value fails its own checksum on use. The walk
reads only branch and leaf pages, so its cost follows the number of keys, not the
bytes stored (docs/BENCHMARKS.md, Measurements behind the code).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_MAGIC = 0xBEEFC0DE
_VERSION = 1
_HEADER = 16                 # page header: pgno u64, pad u16, flags u16, lower u16, upper u16
_NODE = 8                    # node header: lo u16, hi u16, flags u16, ksize u16
_META = struct.Struct("<IIQQ")                # magic, version, address, mapsize
# pad, flags, depth, branch pages, leaf pages, overflow pages, entries, root
_DB = struct.Struct("<IHHQQQQQ")
_TAIL = struct.Struct("<QQ")                  # last_pg, txnid
_P_BRANCH, _P_LEAF, _P_OVERFLOW = 0x01, 0x02, 0x04
_F_BIGDATA, _F_SUBDATA = 0x01, 0x02
_NO_ROOT = (1 << 64) - 1
_NUM_METAS = 2
# Flags a database of this store never has (DUPSORT and friends, REVERSEKEY).
_ODD_DB_FLAGS = 0x02 | 0x04 | 0x10 | 0x20 | 0x40


class Damaged(Exception):
    """The file's structure is broken; the message says where."""


@dataclass(frozen=True)
class _Db:
    flags: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int
    root: int

    @classmethod
    def parse(cls, raw: bytes) -> _Db:
        _pad, flags, depth, branch, leaf, overflow, entries, root = _DB.unpack(raw)
        return cls(flags, depth, branch, leaf, overflow, entries, root)


def check_file(path: Path) -> str | None:
    """Why the LMDB file data.mdb under `path` can't be trusted, or None."""
    data = Path(path) / "data.mdb"
    try:
        with open(data, "rb") as f:
            if f.seek(0, 2) == 0:
                return None             # LMDB writes a new file's metas itself
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                _Check(m).run()
    except Damaged as e:
        return str(e)
    except OSError as e:
        return f"reading it failed: {e}"
    return None


class _Check:
    def __init__(self, m: mmap.mmap) -> None:
        self.m = m
        self.psize = 0
        self.last_pg = 0
        self.txnid = 0
        self.pages = 0              # whole pages in the file
        self.used: list[tuple[int, int]] = []     # (first page, count) of every live page run

    def run(self) -> None:
        free_db, main_db = self._pick_meta()
        free_keys = self._walk("free list", free_db, _int_key)
        named = self._walk("main database", main_db, bytes, named=True)
        for name, db in named:
            if db.flags & _ODD_DB_FLAGS:
                raise Damaged(f"database {name!r} has flags {db.flags:#x} this store never sets")
            self._walk(f"database {name!r}", db, bytes)
        self._check_free(free_keys)

    def _pick_meta(self) -> tuple[_Db, _Db]:
        if len(self.m) < _HEADER + _META.size:
            raise Damaged("the file is shorter than its first meta page")
        metas = []
        psize = _DB.unpack_from(self.m, _HEADER + _META.size)[0]
        if psize < 512 or psize > 65536 or psize & (psize - 1):
            raise Damaged(f"page size {psize} recorded in the first meta page")
        self.psize = psize
        self.pages = len(self.m) // psize
        if self.pages < _NUM_METAS:
            raise Damaged("the file is shorter than its two meta pages")
        for i in range(_NUM_METAS):
            base = i * psize + _HEADER
            magic, version, _addr, _size = _META.unpack_from(self.m, base)
            if magic != _MAGIC or version != _VERSION:
                raise Damaged(f"meta page {i} has magic {magic:#x}, version {version}")
            at = base + _META.size
            dbs = [self.m[at + k * _DB.size:at + (k + 1) * _DB.size] for k in range(2)]
            if _DB.unpack(dbs[0])[0] != psize:
                raise Damaged(f"meta page {i} records another page size")
            last_pg, txnid = _TAIL.unpack_from(self.m, base + _META.size + 2 * _DB.size)
            metas.append((txnid, last_pg, dbs))
        # LMDB uses the meta page of the higher transaction id.
        txnid, last_pg, dbs = max(metas, key=lambda t: t[0])
        if last_pg < _NUM_METAS - 1 or last_pg >= self.pages:
            raise Damaged(f"last page {last_pg} is outside the file's {self.pages} pages")
        self.txnid, self.last_pg = txnid, last_pg
        return _Db.parse(dbs[0]), _Db.parse(dbs[1])

    def _page(self, pgno: int, kind: int, what: str) -> tuple[int, int, int]:
        """(offset, lower, upper) of page `pgno`, checked to be a `kind` page."""
        if not _NUM_METAS <= pgno <= self.last_pg:
            raise Damaged(f"{what}: page {pgno} is outside 2..{self.last_pg}")
        off = pgno * self.psize
        own, _pad, flags, lower, upper = struct.unpack_from("<QHHHH", self.m, off)
        if own != pgno:
            raise Damaged(f"{what}: page {pgno} says it is page {own}")
        if flags & (_P_BRANCH | _P_LEAF | _P_OVERFLOW | 0x08 | 0x20 | 0x40) != kind:
            raise Damaged(f"{what}: page {pgno} has flags {flags:#x}, expected {kind:#x}")
        if kind != _P_OVERFLOW and not (_HEADER <= lower <= upper <= self.psize
                                         and lower % 2 == 0):
            raise Damaged(f"{what}: page {pgno} has bounds {lower}..{upper}")
        return off, lower, upper

    def _walk(self, what: str, db: _Db, key_of, named: bool = False) -> list:
        """Walk one tree; the (key, _Db) of named databases when `named`, else the
        free list's (key, page numbers) when `key_of` is _int_key, else []."""
        found: list = []
        if db.root == _NO_ROOT:
            if db.depth or db.entries or db.branch_pages or db.leaf_pages or db.overflow_pages:
                raise Damaged(f"{what}: no root but counts recorded")
            return found
        counts = [0, 0, 0, 0]                # branch, leaf, overflow pages, entries
        stack = [(db.root, 1, None, None)]   # page, depth, low key (incl.), high key (excl.)
        while stack:
            pgno, depth, low, high = stack.pop()
            if depth > db.depth:
                raise Damaged(f"{what}: page {pgno} is below the recorded depth {db.depth}")
            kind = _P_BRANCH if depth < db.depth else _P_LEAF
            off, lower, upper = self._page(pgno, kind, what)
            self.used.append((pgno, 1))
            n = (lower - _HEADER) // 2
            if n == 0:
                raise Damaged(f"{what}: page {pgno} is empty")
            ptrs = struct.unpack_from(f"<{n}H", self.m, off + _HEADER)
            prev = low
            children = []
            for i, p in enumerate(ptrs):
                node = off + p
                if not upper <= p <= self.psize - _NODE:
                    raise Damaged(f"{what}: page {pgno} node {i} at {p} is outside its page")
                lo, hi, flags, ksize = struct.unpack_from("<HHHH", self.m, node)
                kstart = node + _NODE
                if kstart + ksize > off + self.psize:
                    raise Damaged(f"{what}: page {pgno} node {i} key runs off the page")
                key = key_of(self.m[kstart:kstart + ksize]) if (kind == _P_LEAF or i) else None
                if key is not None:
                    if (prev is not None and key < prev) or (i and key == prev):
                        raise Damaged(f"{what}: page {pgno} key {i} is out of order")
                    if high is not None and key >= high:
                        raise Damaged(f"{what}: page {pgno} key {i} is above its parent's bound")
                    prev = key
                if kind == _P_BRANCH:
                    children.append((lo | hi << 16 | flags << 32, key))
                    continue
                dsize = lo | hi << 16
                found.extend(self._leaf(what, pgno, i, key, flags, kstart + ksize, dsize,
                                        key_of, named, counts))
            if kind == _P_BRANCH:
                counts[0] += 1
                for j, (child, key) in enumerate(children):
                    clow = low if j == 0 else key
                    chigh = children[j + 1][1] if j + 1 < len(children) else high
                    stack.append((child, depth + 1, clow, chigh))
            else:
                counts[1] += 1
        recorded = [db.branch_pages, db.leaf_pages, db.overflow_pages, db.entries]
        if counts != recorded:
            raise Damaged(f"{what}: found branch/leaf/overflow pages and entries {counts}, "
                          f"recorded {recorded}")
        return found

    def _leaf(self, what, pgno, i, key, flags, dstart, dsize, key_of, named, counts) -> list:
        counts[3] += 1
        if flags & ~(_F_BIGDATA | _F_SUBDATA) or flags == _F_BIGDATA | _F_SUBDATA:
            raise Damaged(f"{what}: page {pgno} node {i} has flags {flags:#x}")
        if flags & _F_SUBDATA:
            if not named or dsize != _DB.size or dstart + dsize > (pgno + 1) * self.psize:
                raise Damaged(f"{what}: page {pgno} node {i} is a misplaced database record")
            return [(key, _Db.parse(self.m[dstart:dstart + dsize]))]
        if flags & _F_BIGDATA:
            if dstart + 8 > (pgno + 1) * self.psize:
                raise Damaged(f"{what}: page {pgno} node {i} runs off the page")
            first = struct.unpack_from("<Q", self.m, dstart)[0]
            off, _, _ = self._page(first, _P_OVERFLOW, what)
            run = struct.unpack_from("<I", self.m, off + 12)[0]
            if run != (_HEADER - 1 + dsize) // self.psize + 1 or first + run - 1 > self.last_pg:
                raise Damaged(f"{what}: overflow run at page {first} of {run} pages for "
                              f"{dsize} bytes")
            self.used.append((first, run))
            counts[2] += run
            value = (off + _HEADER, dsize)
        else:
            if dstart + dsize > (pgno + 1) * self.psize:
                raise Damaged(f"{what}: page {pgno} node {i} value runs off the page")
            value = (dstart, dsize)
        if named:
            raise Damaged(f"{what}: page {pgno} node {i} is a plain value in the main database")
        if key_of is _int_key:
            return [(key, value)]
        return []

    def _check_free(self, records: list) -> None:
        ids = []
        for key, (start, size) in records:
            if key > self.txnid:
                raise Damaged(f"free list: a record of transaction {key}, after the "
                              f"last one committed ({self.txnid})")
            if size < 8 or size % 8:
                raise Damaged(f"free list: record {key} has {size} bytes")
            count = struct.unpack_from("<Q", self.m, start)[0]
            if count > size // 8 - 1:
                raise Damaged(f"free list: record {key} lists {count} pages in room for "
                              f"{size // 8 - 1}")
            pages = np.frombuffer(self.m[start + 8:start + 8 + 8 * count], dtype="<u8")
            if count and not (np.all(pages[:-1] > pages[1:]) and pages[-1] >= _NUM_METAS
                              and pages[0] <= self.last_pg):
                raise Damaged(f"free list: record {key} is not a descending list of pages "
                              f"in 2..{self.last_pg}")
            ids.append(pages.astype(np.int64))
        free = np.sort(np.concatenate(ids)) if ids else np.zeros(0, np.int64)
        if free.size and np.any(free[1:] == free[:-1]):
            raise Damaged("free list: a page is listed twice")
        used = np.array(sorted(self.used), dtype=np.int64).reshape(-1, 2)
        starts, ends = used[:, 0], used[:, 0] + used[:, 1]
        if used.size and np.any(starts[1:] < ends[:-1]):
            raise Damaged("two live records share a page")
        if free.size and used.size:
            at = np.searchsorted(starts, free, side="right") - 1
            hit = (at >= 0) & (free < ends[np.maximum(at, 0)])
            if np.any(hit):
                raise Damaged(f"free list: page {int(free[np.argmax(hit)])} is also in use")


def _int_key(raw: bytes) -> int:
    if len(raw) != 8:
        raise Damaged(f"free list: a key of {len(raw)} bytes")
    return int.from_bytes(raw, "little")

"""Reading a restore plan's remote pieces: all at once, each checked, within a deadline.

The objects are fetched in parallel on the client's pool. Each must unpack (frame
checksum, value checksum, format, model, key) and its frame must name what the
plan expects (kind, parent, position, tokens): else it is corrupt, and deleted from
the remote so that the next daemon to compute it puts a good copy back (objects
are never rewritten, so a bad one would otherwise stay). A fetch not done by the
deadline is given up as missing: a slow remote costs a recompute, not a stall.
Decoding is the caller's (cache/store/reader.py), into its pages, after this
returns, so nothing late can write into memory the caller has moved on from.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import wait

from ckptd.cache import codec
from ckptd.cache.entry import EntryMeta
from ckptd.cache.lookup import PieceRef
from ckptd.cache.remote.client import RemoteClient, RemoteError
from ckptd.cache.remote.layout import Layout, unpack

log = logging.getLogger(__name__)
MISSING, CORRUPT = "missing", "corrupt"


class Fetcher:
    def __init__(self, client: RemoteClient, layout: Layout) -> None:
        self.client, self.layout = client, layout
        self.lock = threading.Lock()
        self.restores = self.pieces = self.missing = self.corrupt = self.late = 0
        self.bytes = 0
        self.seconds = 0.0
        # The latest fetch: (objects asked, bytes read, seconds), for restore planning.
        # A fetch cut short by its deadline counts every object asked, over the deadline.
        self.last = (0, 0, 0.0)
        self.last_late = 0

    def fetch(self, pieces: list[PieceRef], expect: dict[bytes, EntryMeta],
              timeout: float) -> list[tuple[EntryMeta, memoryview] | str]:
        """Per piece: (its meta, its LMDB value) or MISSING or CORRUPT."""
        t0 = time.perf_counter()
        futs = [self.client.pool.submit(self._one, p, expect.get(p.key)) for p in pieces]
        done, _ = wait(futs, timeout=timeout)
        out = [f.result() if f in done else MISSING for f in futs]
        late = sum(1 for f in futs if f not in done)
        for f in futs:
            f.cancel()                  # those not started yet; the running ones finish idle
        got = [v for v in out if not isinstance(v, str)]
        seconds = time.perf_counter() - t0
        with self.lock:
            self.last = (len(pieces), sum(len(v) for _, v in got), seconds)
            self.last_late = late
            self.restores += 1
            self.pieces += len(got)
            self.bytes += sum(len(v) for _, v in got)
            self.missing += sum(1 for v in out if v == MISSING)
            self.corrupt += sum(1 for v in out if v == CORRUPT)
            self.late += late
            self.seconds += seconds
        if late:
            self.client.gave_up("get", timeout)
            log.warning("remote: %d of %d objects not read within %.1f s; recomputing",
                        late, len(pieces), timeout)
        return out

    def _one(self, piece: PieceRef, want: EntryMeta | None):
        name = self.layout.value(piece.key, piece.kind)
        try:
            body = self.client.get(name)
        except RemoteError:
            return MISSING
        if body is None:
            return MISSING
        try:
            meta, value = unpack(body, piece.key, self.layout.fp)
            if want is None or (meta.kind, meta.parent, meta.position, meta.tokens) != \
                    (want.kind, want.parent, want.position, want.tokens):
                raise codec.CorruptValue("the object names another entry than planned")
        except codec.CorruptValue as e:
            log.warning("remote: %s is corrupt (%s); deleted, to be recomputed", name, e)
            self._discard(piece.key, piece.kind, want)
            return CORRUPT
        return meta, value

    def _discard(self, key: bytes, kind: str, want: EntryMeta | None) -> None:
        names = [self.layout.value(key, kind)]
        if want is not None and kind == "snapshot":
            names.append(self.layout.marker(want.parent, key))
        try:
            self.client.delete(names)
        except RemoteError:
            pass                         # the next reader finds it bad again

    def stats(self) -> dict:
        with self.lock:
            return {"restores": self.restores, "objects": self.pieces, "bytes": self.bytes,
                    "missing": self.missing, "corrupt": self.corrupt, "late": self.late,
                    "seconds": round(self.seconds, 3)}

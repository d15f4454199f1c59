"""Reading a restore plan's remote pieces: ranged GETs of only the bytes it needs, many
in flight, the values of each range decoded together on a pool as soon as its bytes are in,
within a deadline (the locations, the ranges and a transfer's state: ranges.py).

Every piece has a location (an object, an offset, a length, and the object's size the
plan was made against): a frame of pages (frames.py; the blocks it holds share it, and
it is read and decoded once) or one value (a snapshot, or a block of the old layout).
Pieces adjacent in one object are read together: a run of them is cut into ranges of
at most range_bytes (at value boundaries where it can be), so a 250K-token context is a
few dozen requests, not one per block, and its bytes come over `concurrency`
connections at once. A value spanning ranges is decoded when
the last of them is in. The ranges may start before the restore asks for them (`start`:
the finder begins them once a state's head names them, and the restore's planning runs
while they come); the fetch then takes the transfer over (`fetch(..., started=)`), or
`cancel` stops it when the plan does not read the remote.

Each value is checked as it is decoded (its checksum, format, model and key: the
caller's decode). A bad one is corrupt, and the object holding it is deleted from the
remote, so that the next daemon to compute it puts a good one back (objects are never
rewritten, so a bad one would otherwise stay). An object whose size is not the one the
plan expects is another object under that name (taken by gc and put again): its
pieces count as missing, and it stays. A piece not in by the deadline counts as
missing; the fetch then waits only for decodes already running, so nothing late ever
writes into memory the caller has moved on from.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from ckptd.cache.remote.client import RemoteClient, RemoteError
from ckptd.cache.remote.ranges import CORRUPT, MISSING, Chunk, Loc, Transfer, plan_ranges
from ckptd.cache.remote.state import StateHead
from ckptd.cache.threads import started_pool

log = logging.getLogger(__name__)
_PART_BYTES = 512 << 10    # a ranged GET's body is read and decoded in parts of this


@dataclass
class Lost:
    """What one fetch found gone from the remote (a caller records them: lost.py)."""
    objects: dict[str, str] = field(default_factory=dict)   # name -> CORRUPT or MISSING
    owner: str | None = None          # the state deleted for naming one of them
    swept: list[StateHead] = field(default_factory=list)    # other states deleted with it

    @property
    def cause(self) -> str:
        """CORRUPT when any object was bad, else MISSING: why the states went."""
        return CORRUPT if CORRUPT in self.objects.values() else MISSING


class Fetcher:
    def __init__(self, client: RemoteClient, forget: Callable[[str], object] | None = None,
                 sweep: Callable[[str, set[str]], list[StateHead]] | None = None) -> None:
        """forget(name): an object found missing, or bad (and deleted). sweep(state,
        segments): delete the other states that name segments a state read named and
        that are bad or gone, returning their heads (cache/remote/sweep.py)."""
        self.client, self.cfg, self.forget, self.sweep = client, client.config, forget, sweep
        # Its own connections' threads: a restore's ranges start while the lookup's
        # LISTs may still be out on the client's pool.
        self.pool = started_pool(self.cfg.concurrency, "ckptd-fetch")
        self.lock = threading.Lock()
        self.restores = self.pieces = self.missing = self.corrupt = self.late = 0
        self.requests = self.bytes = 0
        self.early = self.unused = self.unused_bytes = 0   # transfers started before asked
        self.waiting: set[Transfer] = set()                # started, not taken over yet
        self.seconds = self.transfer_seconds = 0.0   # all of it; until the last byte
        # The latest fetch: (request rounds, bytes read, seconds), for restore planning.
        self.last = (0, 0, 0.0)
        self.last_late = 0

    def rounds(self, locs: list[Loc]) -> int:
        """Request rounds a fetch of locs takes: its ranged GETs over the connections."""
        return math.ceil(len(plan_ranges(locs, self.cfg.range_bytes)) / self.cfg.concurrency)

    def start(self, locs: list[Loc]) -> Transfer:
        """Begin reading locs now, before a fetch asks for them (it then takes this
        transfer over); `cancel` it when none will."""
        locs = list(dict.fromkeys(locs))
        chunks = plan_ranges(locs, self.cfg.range_bytes)
        run = Transfer(locs, chunks)
        with run.lock:
            run.gets = [self.pool.submit(self._get, run, c) for c in chunks]
        with self.lock:
            self.waiting.add(run)
        return run

    def cancel_waiting(self) -> None:
        """Cancel every transfer started and not taken over (a restore that planned
        without the remote, or failed before it read)."""
        with self.lock:
            runs, self.waiting = list(self.waiting), set()
        for run in runs:
            self.cancel(run)

    def cancel(self, run: Transfer | None) -> None:
        """A transfer no fetch took over: its ranges stop at their next part."""
        if run is None:
            return
        with run.lock:
            if run.cancelled or run.wanted is not None:
                return
            run.cancelled = True
            run.whole = []
        for f in run.gets:
            f.cancel()
        with self.lock:
            self.waiting.discard(run)
            self.unused += 1
            self.requests += len(run.chunks)
            self.unused_bytes += run.got

    def fetch(self, locs: list[Loc], timeout: float,
              decode: Callable[[list[tuple[int, memoryview]]], list],
              pool: Executor, owner: str | None = None, lost: Lost | None = None,
              started: Transfer | None = None) -> list:
        """decode([(i, value), ...]) on `pool` for the locations whose bytes came in with
        one part (a result per value; i indexes locs);
        returns, per location, what decode returned (CORRUPT for a bad value), or
        MISSING. started: a transfer begun for these (`start`), taken over when it
        holds all of locs. owner: the
        state object that named these locations: when one of them is corrupt or not
        there, it names what is not there, and is deleted too, with the other states
        that name it (the next daemon that computes it puts them again). lost: filled
        with what was found gone (deleted here, or before)."""
        t0 = time.perf_counter()
        run = started if started is not None and started.covers(locs) else None
        if run is None:
            self.cancel(started)
            run = self.start(locs)
        with self.lock:
            self.waiting.discard(run)
            self.early += run is started
        with run.lock:
            run.attach(locs, decode, pool)
            run.done.wait_for(lambda: not run.open, timeout)
            run.cancelled = True
            late = run.open
            for i, w in enumerate(run.wanted):
                if w:
                    run.resolve(i, MISSING)
            started_decodes = list(run.decodes)
        for f in run.gets:
            f.cancel()                 # those not started; the running ones finish idle
        for f in started_decodes:
            f.cancel()
            if not f.cancelled():
                f.exception()          # a decode that had begun writes before we return
        self._forget_bad(run.bad)
        if self.forget is not None:
            for name in run.gone:
                self.forget(name)
        if lost is not None:
            lost.objects.update(dict.fromkeys(run.gone, MISSING))
            lost.objects.update(dict.fromkeys(run.bad, CORRUPT))
        if owner is not None and (run.bad | run.gone) - {owner}:
            log.warning("remote: state %s names a segment that is not there; deleted", owner)
            self._delete(owner)
            swept = self.sweep(owner, (run.bad | run.gone) - {owner}) if self.sweep else []
            if lost is not None:
                lost.owner, lost.swept = owner, swept
        out = [run.out[run.index[loc]] for loc in locs]
        got = sum(loc.length for loc, v in zip(locs, out) if v not in (MISSING, CORRUPT))
        now = time.perf_counter()
        with self.lock:
            rounds = math.ceil(len(run.chunks) / self.cfg.concurrency)
            # from the transfer's start: what the restore planner prices is the network's
            # time, however much of it the planning hid
            self.last, self.last_late = (rounds, got, now - run.started), late
            self.restores += 1
            self.requests += len(run.chunks)
            self.pieces += sum(1 for v in out if v not in (MISSING, CORRUPT))
            self.bytes += got
            self.missing += sum(1 for v in out if v == MISSING)
            self.corrupt += sum(1 for v in out if v == CORRUPT)
            self.late += late
            self.seconds += now - t0
            self.transfer_seconds += max(0.0, run.last_byte - run.started)
        if late:
            self.client.gave_up("get", timeout)
            log.warning("remote: %d of %d values not read within %.1f s; recomputing",
                        late, len(locs), timeout)
        return out

    def _get(self, run: Transfer, c: Chunk) -> None:
        """One ranged GET, read into its buffer in parts: the values each part completes
        go to their decode while the rest comes in (a range's decode waiting for its
        last byte was most of a 32K restore's fetch on two loaded cores)."""
        # Never resized, each byte written once: views of it go to decodes, and outlive
        # the fetch (a restore writes the values through into LMDB as they are).
        buf = bytearray(c.end - c.start)
        view = memoryview(buf)
        nxt = 0                                # c.values[nxt]: the first not handed on
        have = 0

        def progress(size: int, now: int) -> bool:
            nonlocal nxt, have
            with run.lock:
                if run.cancelled:
                    return False
                if size != c.size:
                    log.warning("remote: %s is %d bytes, planned as %d: another object "
                                "under its name; not read", c.name, size, c.size)
                    self._lose(run, c, nxt, gone=True)
                    return False
                run.got += now - have
                have = now
                if have == len(buf):
                    run.last_byte = time.perf_counter()
                ready = []
                while nxt < len(c.values):
                    i = c.values[nxt]
                    loc = run.locs[i]
                    hi = min(loc.offset + loc.length, c.end)
                    if hi - c.start > have:
                        break
                    nxt += 1
                    piece = self._piece(run, c, loc, i, buf)
                    if piece is not None:
                        ready.append((i, piece))
                if ready:
                    run.hand(ready, c.name)
            return True
        try:
            found = run.cancelled or self.client.read_into(c.name, c.start, view, _PART_BYTES,
                                                           progress)
            failed = False
        except RemoteError:          # the remote failing says nothing of the object
            found, failed = True, True
        with run.lock:
            if not run.cancelled and nxt < len(c.values):     # missing, or cut short
                self._lose(run, c, nxt, gone=not failed and (not found or have < len(buf)))

    @staticmethod
    def _piece(run: Transfer, c: Chunk, loc: Loc, i: int, buf: bytearray
               ) -> memoryview | None:
        """Location i's bytes in chunk c (all in buf now): its value when that is whole,
        else None (a value spanning ranges waits for the others). Under the lock."""
        lo, hi = max(loc.offset, c.start), min(loc.offset + loc.length, c.end)
        if run.out[i] is not None:
            return None
        if lo == loc.offset and hi == loc.offset + loc.length:
            view = memoryview(buf)[lo - c.start:hi - c.start]            # all here
        else:
            part = run.bufs.setdefault(i, bytearray(loc.length))
            part[lo - loc.offset:hi - loc.offset] = buf[lo - c.start:hi - c.start]
            view = memoryview(part)
        run.waiting[i] -= 1
        return view if not run.waiting[i] else None

    @staticmethod
    def _lose(run: Transfer, c: Chunk, first: int, gone: bool) -> None:
        """The values of c from c.values[first] on did not come: missing (and c's object
        gone, when the remote said so rather than failed). Under the lock."""
        if gone:
            run.gone.add(c.name)
        for i in c.values[first:]:
            run.resolve(i, MISSING)

    def _forget_bad(self, names: set[str]) -> None:
        for name in names:
            log.warning("remote: %s holds a corrupt value; deleted, to be put again", name)
            self._delete(name)
            if self.forget is not None:
                self.forget(name)

    def _delete(self, name: str) -> None:
        try:
            self.client.delete([name])
        except RemoteError:
            pass                                   # the next reader finds it bad again

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict:
        with self.lock:
            return {"restores": self.restores, "objects": self.pieces, "bytes": self.bytes,
                    "requests": self.requests, "missing": self.missing,
                    "corrupt": self.corrupt, "late": self.late,
                    "early": self.early, "unused": self.unused,
                    "unused_bytes": self.unused_bytes,
                    "seconds": round(self.seconds, 3),
                    "transfer_seconds": round(self.transfer_seconds, 3)}

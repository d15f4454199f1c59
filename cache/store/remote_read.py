"""The remote's part of a restore (the reader's, cache/store/reader.py): the plan's run
of blocks and its remote pieces fetched all at once (cache/remote/fetch.py), each frame
or value decoded on the reader pool as its bytes come in, and what came written
through into LMDB later, once the engine is idle (`WriteThrough`).

A frame is read once, checked once and decompressed into every page it holds
(cache/remote/frames.py): straight into them when they lie end to end, in one strided
copy when they are consecutive pages of a pool laid out by head, else page by page.
Its blocks' LMDB values are cut from it on the promoter, off the restore's path.
"""

from __future__ import annotations

import logging
import threading

from ckptd.cache import codec
from ckptd.cache.lookup import PieceRef, RestorePlan
from ckptd.cache.remote import frames as remote_frames
from ckptd.cache.remote import lost as remote_lost
from ckptd.cache.remote.fetch import Lost
from ckptd.cache.remote.ranges import CORRUPT
from ckptd.cache.tiers import pagein

log = logging.getLogger(__name__)
IDLE_WAIT = 2.0              # s a remote restore's write-through waits for an idle engine


class WriteThrough:
    """What remote restores read goes into LMDB on the promoter once the engine has
    nothing to run (`idle_now`), or IDLE_WAIT after the restore: decompressing 64 MB of
    frames again and encoding 15,625 blocks beside a 250K-token request's first steps
    made it ~0.6 s slower than the same request after an LMDB restore. The store's own
    puts that need those blocks wait behind it (`after`)."""

    def __init__(self, promoter) -> None:
        self.promoter = promoter
        self.idle = threading.Event()
        self.waiting = 0          # promoter jobs the store's puts wait for
        self.lock = threading.Lock()

    def queue(self, fn, *args) -> None:
        """fn(*args) on the promoter once the engine is idle (or IDLE_WAIT from now)."""
        self.idle.clear()
        with self.lock:
            self.waiting += 1
        self.promoter.submit(self._counted, self._when_idle, fn, *args)

    def after(self, fn) -> bool:
        """Run fn on the promoter after the write-throughs waiting there (a checkpoint
        after a remote restore: its blocks' parents are those the write-through keeps,
        and a put whose parent is neither stored nor queued is dropped); False when none
        waits (the caller runs fn itself)."""
        with self.lock:
            if not self.waiting:
                return False
            self.waiting += 1
        self.promoter.submit(self._counted, fn)
        return True

    def idle_now(self) -> None:
        """The engine has nothing to run: what restores left to write goes ahead."""
        self.idle.set()

    def _when_idle(self, fn, *args) -> None:
        self.idle.wait(IDLE_WAIT)
        fn(*args)

    def _counted(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:      # nobody waits on the promoter's futures: say it here
            log.exception("cache: work queued behind a restore's write-through failed")
        finally:
            with self.lock:
                self.waiting -= 1


def load(r, plan: RestorePlan, idx: list[int], into: list, values: list,
         timeout: float, run_outs: list) -> tuple[int, list[bytes], int]:
    """Fetch the plan's run of remote blocks into run_outs (their pages) and its remote
    pieces idx (into `values`, as r.load holds them; r: the store's Reader), the
    ranges the finder started when it read the state's head taken over; queue the good
    ones for the write-through up to the first that failed (what follows it would be
    orphans).
    Returns how many of the run's blocks came (a prefix), the keys of its corrupt
    ones and how many of its blocks did not come."""
    pieces, found, run = plan.listed(), plan.remote, plan.blocks.run
    spans = run.spans if run is not None else []
    places = found.places_of([pieces[i] for i in idx])
    locs = list(dict.fromkeys([*(s.loc for s in spans),
                               *(places[pieces[i].key] for i in idx)]))
    at = {loc: u for u, loc in enumerate(locs)}
    readers: list[list[int]] = [[] for _ in locs]        # loc -> pieces read from it
    for i in idx:
        readers[at[places[pieces[i].key]]].append(i)
    bb = found.block_bytes
    # where each run page is (-1: not one contiguous CPU page): a frame whose pages
    # lie end to end is decompressed straight into them
    ptrs = remote_frames.addresses(run_outs) if run is not None else []
    if ptrs:
        # Pool pages a fresh daemon never touched fault in as the frames decode into
        # them, holding the GIL (~0.5 ms a 512 KiB frame, the transfer's threads
        # waiting): faulted in here ahead, beside the transfer, without it.
        r.prefetcher.submit(pagein.write_ready_pages, ptrs, bb)
    raw: dict[int, memoryview] = {}
    ns = len(spans)

    def decode(ready: list[tuple[int, memoryview]]) -> list:
        out: list = [None] * len(ready)
        plain = []
        for k, (u, buf) in enumerate(ready):
            if u < ns and spans[u].frame is not None:
                out[k] = _frame(buf, spans[u], run, run_outs, ptrs, bb)
            else:
                plain.append(k)
        if plain:
            items = []
            for k in plain:
                u, buf = ready[k]
                if u < ns:                      # an old-layout value of the run
                    b = spans[u].first
                    items.append((run.chain.keys[b], buf, {"kv": run_outs[b - run.lo]}))
                else:
                    i = readers[u][0]
                    items.append((pieces[i].key, buf, into[i]))
            for k, v in zip(plain, r.decode_many(items)):
                out[k] = v
        # Kept for LMDB (the write-through) as the views they are: the fetch never
        # writes a range's bytes twice, nor after it returns, and a copy of each value
        # was a fifth of decoding it.
        raw.update((u, buf) for (u, buf), v in zip(ready, out) if isinstance(v, dict))
        return out
    lost = Lost()
    got = r.fetcher.fetch(locs, timeout, decode, r.pool, found.state, lost,
                          started=found.transfer)
    run_good, run_corrupt, run_missing = (len(run) if run is not None else 0), [], 0
    for u in range(ns):
        if not isinstance(got[u], dict):
            run_good = min(run_good, max(spans[u].first, run.lo) - run.lo)
            if got[u] == CORRUPT:
                run_corrupt += [run.chain.keys[b] for b in run.blocks_of(spans[u])]
            else:
                run_missing += len(run.blocks_of(spans[u]))
    for u in range(ns, len(locs)):
        for i in readers[u]:
            values[i] = into[i] if isinstance(got[u], dict) and into[i] is not None \
                else got[u]
    # in chain order: the writer takes no block before its parent (the run's blocks
    # come before the pieces read here: the snapshot)
    good = next((n for n, i in enumerate(idx) if not isinstance(values[i], dict)), len(idx))
    good = idx[:good] if run is None or run_good == len(run) else []
    # a snapshot's tensors are copied now: the caller may change its own
    snaps = {i: {k: t.clone() for k, t in values[i].items()} for i in good
             if into[i] is None}
    if (good or run_good) and r.adopt is not None:
        r.writes.queue(_keep, r, pieces, good, found, at, raw, snaps,
                       run.head(run_good) if run_good else None, places)
    if lost.objects:
        kept = {pieces[i].key for i in good}
        if run_good:
            kept.update(run.head(run_good).keys())
        remote_lost.record(r.gone, lost, found.where, found.metas, kept, r.fp)
    return run_good, run_corrupt, run_missing


def _frame(buf: memoryview, span, run, outs: list, ptrs: list[int], bb: int):
    """One frame's pages written into the run's pages it holds: a dict (as a decoded
    value is), or CORRUPT."""
    frame, lo = span.frame, run.lo
    blocks = run.blocks_of(span)
    a, n = blocks.start - lo, len(blocks)
    whole = blocks.start == span.first and n == frame.blocks
    if whole and ptrs[a] >= 0 \
            and ptrs[a:a + n] == list(range(ptrs[a], ptrs[a] + n * bb, bb)):
        dest = remote_frames.run_view(outs[a], n * bb)
    else:
        dest = outs.run(a, n) if whole and hasattr(outs, "run") else None
        if dest is None:
            dest = {b - span.first: outs[b - lo] for b in blocks}
    try:
        remote_frames.into_pages(buf, frame, bb, dest)
    except codec.CorruptValue:
        return CORRUPT
    return {}


def _keep(r, pieces: list[PieceRef], good: list[int], found, at: dict, raw: dict,
          snaps: dict, run, places: dict) -> None:
    """What a remote restore read, handed to adopt in chain order (the write-through, on
    the promoter): the run's blocks, then the pieces. Blocks the store knows by now (a
    checkpoint put them from the device pages) are not cut from their frames again."""
    keep = []
    if run is not None:
        keys, known = run.chain.keys, r.catalog.known
        for s in run.spans:
            buf = raw[at[s.loc]]
            for b in [b for b in run.blocks_of(s) if not known(keys[b])]:
                keep.append((keys[b], run.meta(b).entry(), buf, None, s.frame,
                             b - s.first) if s.frame is not None else
                            (keys[b], run.meta(b).entry(), buf, None, None, 0))
    for i in good:
        key = pieces[i].key
        keep.append((key, found.meta(key), raw[at[places[key]]], snaps.get(i), None, 0))
    _adopt(r, keep, found.block_bytes)


def _adopt(r, keep: list, block_bytes: int) -> None:
    """Hand what a remote restore read to adopt, in order: values as they came, and
    blocks of frames cut into LMDB values (each frame decompressed once more, each
    block encoded as the writer encodes a page)."""
    out, framed = [], []
    for key, meta, buf, tensors, frame, j in keep + [(None,) * 6]:
        if frame is not None:
            framed.append((key, meta, buf, frame, j))
            continue
        if framed:
            cut = remote_frames.cut_values(framed, block_bytes, r.spec, r.fp)
            out += cut
            if len(cut) < len(framed):
                break                  # what follows would be orphans
            framed = []
        if key is not None:
            out.append((key, meta, buf, tensors))
    r.adopt(out)

"""Loading a restore plan: RAM pieces are copied; disk pieces are read and decoded on
the reader pool straight into the output pages (two helpers run ahead of it: disk
read-ahead, output page faults), verified, and promoted into RAM. Remote pieces are
fetched all at once (cache/remote/fetch.py), decoded the same way, and handed to
`adopt`, which keeps them in LMDB (and a snapshot in RAM) for the next restore, once
the engine is idle."""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures

import lmdb
import torch

from ckptd.cache import codec, codec_batch
from ckptd.cache.entry import BLOCK
from ckptd.cache.lookup import DEVICE, DISK, HOST, REMOTE, PieceRef, RestoredState, RestorePlan
from ckptd.cache.remote import frames as remote_frames
from ckptd.cache.remote import lost as remote_lost
from ckptd.cache.remote.fetch import Lost
from ckptd.cache.remote.ranges import CORRUPT, MISSING
from ckptd.cache.snapshot import Snapshot
from ckptd.cache.store.catalog import Catalog
from ckptd.cache.threads import started_pool
from ckptd.cache.tiers import pagein
from ckptd.cache.tiers.disk import DiskFull, DiskTier
from ckptd.cache.tiers.host import HostTier, owned_copy
from ckptd.cache.why import gone as departures
from ckptd.cache.why.gone import Gone
from ckptd.model.spec import StateSpec

log = logging.getLogger(__name__)
_MISSING, _CORRUPT = MISSING, CORRUPT
_AHEAD = 8                   # values per read-ahead step
_READ_ONCE_MAX = 1 << 20     # keys remembered as read from disk once (~80 MB at most)
_IDLE_WAIT = 2.0             # s a remote restore's write-through waits for an idle engine


class Reader:
    def __init__(self, catalog: Catalog, host: HostTier, disk: DiskTier, spec: StateSpec | None,
                 fingerprint: str | None, threads: int, readonly: bool,
                 fetcher=None, adopt=None, gone: Gone | None = None) -> None:
        """fetcher: the remote tier's (None without one); adopt(items): keeps what it
        read, [(key, meta, value bytes, tensors to hold in RAM or None)]; gone: where
        dropped values are recorded."""
        self.catalog, self.host, self.disk = catalog, host, disk
        self.gone = gone if gone is not None else Gone()
        self.fetcher, self.adopt = fetcher, adopt
        self.spec, self.fp, self.readonly = spec, fingerprint, readonly
        self.B = spec.block_size if spec is not None else None
        self.threads = threads
        self.pool = started_pool(threads, "ckptd-read")
        # A restore's read-ahead helpers, beside the readers (hints: loads don't wait on them).
        self.prefetcher = started_pool(2, "ckptd-prefetch")
        # Copies of restored blocks into RAM, made after the restore returns, of blocks
        # read from disk once before in this process (`read_once`).
        self.promoter = started_pool(1, "ckptd-promote")
        self.read_once: set[bytes] = set()
        # What a remote restore read goes into LMDB once the engine has nothing to run
        # (`idle_now`), or _IDLE_WAIT after the restore: decompressing 64 MB of frames
        # again and encoding 15,625 blocks beside a 250K-token request's first steps
        # made it ~0.6 s slower than the same request after an LMDB restore.
        self.idle = threading.Event()
        # Promoter jobs the store's own puts must wait for: write-throughs, and the puts
        # queued behind them (after_keeps).
        self.keeps = 0
        self.keeps_lock = threading.Lock()

    def after_keeps(self, fn) -> bool:
        """Run fn on the promoter after the write-throughs waiting there (a checkpoint
        after a remote restore: its blocks' parents are those the write-through keeps,
        and a put whose parent is neither stored nor queued is dropped); False when none
        waits (the caller runs fn itself)."""
        with self.keeps_lock:
            if not self.keeps:
                return False
            self.keeps += 1
        self.promoter.submit(self._counted, fn)
        return True

    def _counted(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:      # nobody waits on the promoter's futures: say it here
            log.exception("cache: work queued behind a restore's write-through failed")
        finally:
            with self.keeps_lock:
                self.keeps -= 1

    def idle_now(self) -> None:
        """The engine has nothing to run: what restores left to write goes ahead."""
        self.idle.set()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every restored block so far is promoted into RAM (and what remote
        restores read is handed to the writer)."""
        self.idle.set()
        try:
            self.promoter.submit(lambda: None).result(timeout)
        except futures.TimeoutError:
            return False
        except RuntimeError:                 # closed: nothing is pending
            pass
        return True

    def close(self) -> None:
        self.pool.shutdown()
        self.prefetcher.shutdown()
        self.promoter.shutdown()

    def load(self, plan: RestorePlan, into_pages: list[torch.Tensor] | None = None,
             remote_timeout: float = 30.0) -> RestoredState:
        """The tensors of a plan: pages [n_blocks, *kv_shape()] and the snapshot. A piece
        that is gone or fails verification ends the restore there: the result is then
        not ok, with the position of the longest good prefix, never wrong data (the
        caller plans again below it). The plan's device blocks are the caller's: they
        are neither read nor part of `pages`.

        into_pages: where the blocks go, one [*kv_shape()] CPU tensor each (views of the
        caller's KV pool pages; any strides; or cache/page_views.py's PoolPages, whose
        views are made as needed): they are written in place and `pages` is None.
        Memory the pool already holds is not faulted in anew, as a fresh output buffer
        is on every restore (the kernel zeroing its pages was half a restarted daemon's
        first disk restore). remote_timeout: seconds the remote pieces may take
        (then they count as missing)."""
        first = plan.device_blocks
        # pieces: the blocks held one by one, then the snapshot; the remote's run of
        # blocks (plan.blocks.run) comes after those blocks and is read as a whole
        pieces, nb = plan.listed(), len(plan.blocks)
        run = plan.blocks.run if self.fetcher is not None else None
        if plan.blocks.run is not None and run is None:
            raise ValueError("a plan with the remote's blocks, and no remote to read")
        nr = len(plan.blocks.refs)
        pages = None
        if into_pages is not None:
            if len(into_pages) < nb:
                raise ValueError(f"the plan reads {nb} blocks, into_pages holds "
                                 f"{len(into_pages)}")
            outs = into_pages[:nb]
        elif nb:
            # pinned where there is CUDA: the copy up to the device is then asynchronous
            pages = torch.empty((nb, *self.spec.kv_shape()), dtype=self.spec.kv_dtype,
                                pin_memory=torch.cuda.is_available())
            outs = list(pages)
        else:
            outs = []
        # the pieces' pages as tensors (pool pages make their views here, in one call);
        # the run's pages stay as they are: its frames need few views
        ref_outs = outs[:nr]
        ref_outs = ref_outs.tensors() if hasattr(ref_outs, "tensors") else ref_outs
        into = [{"kv": ref_outs[i]} if i < nr else None for i in range(len(pieces))]
        values: list = [None] * len(pieces)
        from_disk, from_remote = [], []
        held = self.host.get_many([p.key for p in pieces])
        if held.count(None) == len(held):           # none in RAM (a fresh daemon): no loop
            if self.fetcher is not None:
                from_remote = [i for i, p in enumerate(pieces) if p.tier == REMOTE]
            from_disk = sorted(set(range(len(pieces))).difference(from_remote))
            held = []
        for i, (p, v) in enumerate(zip(pieces, held)):
            if v is None:
                (from_remote if p.tier == REMOTE and self.fetcher else from_disk).append(i)
            elif i < nr:
                values[i] = into[i]
                ref_outs[i].copy_(v["kv"])
            else:
                values[i] = {k: t.clone() for k, t in v.items()}
        if from_disk:
            # Two helpers run ahead of the readers, in the order they go: one asks the
            # disk for the values (it mostly waits), one faults in the output pages the
            # values decode into (CPU). See cache/tiers/pagein.py.
            done = threading.Event()
            refs = [(pieces[i].key, pieces[i].kind) for i in from_disk]
            self.prefetcher.submit(_ahead, refs, self.disk.prefetch, done)
            if pages is not None:                 # fresh memory: fault it in ahead
                fresh = [into[i]["kv"] for i in from_disk if into[i] is not None]
                self.prefetcher.submit(_ahead, fresh, _write_ready, done)
            n = self.threads
            groups = [g for g in (from_disk[t::n] for t in range(n)) if g]
            jobs = [[(pieces[i], into[i]) for i in g] for g in groups]
            try:
                for group, got in zip(groups, self.pool.map(self._read_group, jobs)):
                    for i, v in zip(group, got):
                        values[i] = v
            finally:
                done.set()
        run_good, run_corrupt, run_missing = 0, [], 0
        if from_remote or run is not None:
            run_good, run_corrupt, run_missing = self._load_remote(
                plan, from_remote, into, values, remote_timeout, outs[nr:])
        bad = [i for i, v in enumerate(values) if not isinstance(v, dict)]
        corrupt = [pieces[i].key for i in bad if values[i] == _CORRUPT] + run_corrupt
        if corrupt:
            self.drop(corrupt, REMOTE if from_remote or run is not None else DISK)
        self._touch_and_promote(pieces, values, from_disk, from_remote,
                                at_once=into_pages is not None,
                                remote_bytes=run.head(run_good).nbytes if run_good else 0)
        snap = values[nr] if plan.snapshot is not None else None
        if isinstance(snap, dict) and plan.snapshot.position != plan.position:
            # Attention only: a later state's page, cut to the tokens the prompt shares
            # (its logits belong to that later state).
            snap = {"kv": snap["kv"][:, :, :plan.position % self.B].clone()}
        # the first failed block, in prompt order: a piece, else one of the run's
        lost = next((i for i in bad if i < nr), None)
        if lost is None and run is not None and run_good < len(run):
            lost = nr + run_good
        if lost is None and bad:
            lost = nb                                # the snapshot
        if lost is None:
            remote = from_remote or run is not None
            tier = REMOTE if remote else DISK if from_disk else HOST if pieces else DEVICE
            snap = Snapshot.from_tensors(snap) if isinstance(snap, dict) else None
            return RestoredState(plan.position, pages, snap, tier=tier if plan.position else None,
                                 first_block=first, kept_from=run.lo if run is not None
                                 and self.adopt is not None and not self.readonly else None)
        with self.catalog.lock:
            self.catalog.counters.missing += run_missing + sum(values[i] != _CORRUPT
                                                               for i in bad)
        return RestoredState((first + lost) * self.B, None, None, ok=False,
                             dropped=len(corrupt), first_block=first)

    def _load_remote(self, plan: RestorePlan, idx: list[int], into: list, values: list,
                     timeout: float, run_outs: list) -> tuple[int, list[bytes], int]:
        """Fetch the plan's run of remote blocks into run_outs (their pages) and its
        remote pieces idx, each frame or value decoded on the reader pool as its bytes
        come in (cache/remote/fetch.py; the finder started their ranges when it read
        the state's head); adopt the good ones up to the first that failed (what
        follows it would be orphans). A frame is read once, checked once and
        decompressed into every page it holds (cache/remote/frames.py); its blocks'
        LMDB values are cut from it later, off the restore's path. Returns how many of
        the run's blocks came (a prefix), the keys of its corrupt ones and how many of
        its blocks did not come."""
        pieces, found = plan.listed(), plan.remote
        run = plan.blocks.run if self.fetcher is not None else None
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
            self.prefetcher.submit(pagein.write_ready_pages, ptrs, bb)
        raw: dict[int, memoryview] = {}
        ns = len(spans)

        def decode(ready: list[tuple[int, memoryview]]) -> list:
            out: list = [None] * len(ready)
            plain = []
            for r, (u, buf) in enumerate(ready):
                if u < ns and spans[u].frame is not None:
                    out[r] = self._frame(buf, spans[u], run, run_outs, ptrs, bb)
                else:
                    plain.append(r)
            if plain:
                items = []
                for r in plain:
                    u, buf = ready[r]
                    if u < ns:                      # an old-layout value of the run
                        b = spans[u].first
                        items.append((run.chain.keys[b], buf, {"kv": run_outs[b - run.lo]}))
                    else:
                        i = readers[u][0]
                        items.append((pieces[i].key, buf, into[i]))
                for r, v in zip(plain, self._decode_many(items)):
                    out[r] = v
            # Kept for LMDB (adopt) as the views they are: the fetch never writes a
            # range's bytes twice, nor after it returns, and a copy of each value was a
            # fifth of decoding it.
            raw.update((u, buf) for (u, buf), v in zip(ready, out) if isinstance(v, dict))
            return out
        lost = Lost()
        got = self.fetcher.fetch(locs, timeout, decode, self.pool, found.state, lost,
                                 started=found.transfer)
        run_good, run_corrupt, run_missing = (len(run) if run is not None else 0), [], 0
        for u in range(ns):
            if not isinstance(got[u], dict):
                run_good = min(run_good, max(spans[u].first, run.lo) - run.lo)
                if got[u] == _CORRUPT:
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
        if (good or run_good) and self.adopt is not None:
            # Off the restore's path, as disk reads' promotions are: queueing ~16K
            # blocks for the writer took longer than reading them.
            self.idle.clear()
            with self.keeps_lock:
                self.keeps += 1
            self.promoter.submit(self._counted, self._when_idle, self._keep, pieces, good,
                                 found, at, raw, snaps, run.head(run_good) if run_good else None,
                                 places)
        if lost.objects:
            kept = {pieces[i].key for i in good}
            if run_good:
                kept.update(run.head(run_good).keys())
            remote_lost.record(self.gone, lost, found.where, found.metas, kept, self.fp)
        return run_good, run_corrupt, run_missing

    def _when_idle(self, fn, *args) -> None:
        self.idle.wait(_IDLE_WAIT)
        fn(*args)

    @staticmethod
    def _frame(buf: memoryview, span, run, outs: list, ptrs: list[int], bb: int):
        """One frame's pages written into the run's pages it holds: a dict (as a decoded
        value is), or _CORRUPT."""
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
            return _CORRUPT
        return {}

    def _keep(self, pieces: list[PieceRef], good: list[int], found, at: dict, raw: dict,
              snaps: dict, run, places: dict) -> None:
        """What a remote restore read, handed to adopt in chain order (on the promoter
        thread, after the restore has returned): the run's blocks, then the pieces.
        Blocks the store knows by now (a checkpoint after the restore put them from
        the device pages) are not cut from their frames again."""
        keep = []
        if run is not None:
            keys, known = run.chain.keys, self.catalog.known
            for s in run.spans:
                buf = raw[at[s.loc]]
                for b in [b for b in run.blocks_of(s) if not known(keys[b])]:
                    keep.append((keys[b], run.meta(b).entry(), buf, None, s.frame,
                                 b - s.first) if s.frame is not None else
                                (keys[b], run.meta(b).entry(), buf, None, None, 0))
        for i in good:
            key = pieces[i].key
            keep.append((key, found.meta(key), raw[at[places[key]]], snaps.get(i), None, 0))
        self._adopt(keep, found.block_bytes)

    def _adopt(self, keep: list, block_bytes: int) -> None:
        """Hand what a remote restore read to adopt, in order: values as they came, and
        blocks of frames cut into LMDB values (each frame decompressed once more, each
        block encoded as the writer encodes a page)."""
        out, framed = [], []
        for key, meta, buf, tensors, frame, j in keep + [(None,) * 6]:
            if frame is not None:
                framed.append((key, meta, buf, frame, j))
                continue
            if framed:
                cut = remote_frames.cut_values(framed, block_bytes, self.spec, self.fp)
                out += cut
                if len(cut) < len(framed):
                    break                  # what follows would be orphans
                framed = []
            if key is not None:
                out.append((key, meta, buf, tensors))
        self.adopt(out)

    def _read_group(self, job: list[tuple[PieceRef, dict | None]]) -> list:
        into = [out for _, out in job]

        def decode(got: list[tuple[bytes, memoryview | None]]) -> list:
            return self._decode_many([(k, buf, d) for (k, buf), d in zip(got, into)])
        try:
            return self.disk.read_batch([(ref.key, ref.kind) for ref, _ in job], decode)
        except lmdb.Error as e:
            # A damaged file can break LMDB's own pages: serve nothing from this group
            # (the restore falls back to the good prefix) rather than fail the request.
            log.warning("cache: disk read failed: %s", e)
            return [_MISSING] * len(job)

    def _decode_many(self, items: list[tuple[bytes, memoryview | None, dict | None]]) -> list:
        """Values' tensors, decoded into their dests where given (cache/codec_batch.py);
        _MISSING or _CORRUPT."""
        got = codec_batch.decode_many([(buf, key, dest) for key, buf, dest in items], self.fp)
        return [_MISSING if buf is None else _CORRUPT if v is None else v
                for (_, buf, _), v in zip(items, got)]

    def _touch_and_promote(self, pieces: list[PieceRef], values: list, from_disk: list[int],
                           from_remote: list[int], at_once: bool = False,
                           remote_bytes: int = 0):
        """from_disk, from_remote: the pieces read from disk and from the remote (the
        rest came from RAM); remote_bytes: what the remote's run of blocks gave. at_once:
        copy blocks into RAM before returning (they are the caller's pool pages, which
        may be reused once the restore has returned)."""
        now, promote = time.time(), []
        disk = set(from_disk)
        # what the remote gave is not in the index yet (adopt commits it later): counted
        # by the bytes, not touched
        local = sorted(set(range(len(pieces))).difference(from_remote)) if from_remote \
            else range(len(pieces))
        with self.catalog.lock:
            counted = self.catalog.counters.read_bytes
            counted[REMOTE] += remote_bytes + sum(pieces[i].nbytes for i in from_remote
                                                  if isinstance(values[i], dict))
            for i in local:
                p = pieces[i]
                if not isinstance(values[i], dict):
                    continue
                counted[DISK if i in disk else HOST] += p.nbytes
                meta = self.catalog.index.get(p.key)
                if meta is None:
                    continue                 # in RAM only, not yet committed
                meta.last_used, meta.hits = now, meta.hits + 1
                self.catalog.touched[p.key] = meta
                if i in disk and self.host.accepts(meta.logical_bytes) \
                        and self._into_ram(p.key, meta):
                    promote.append((p.key, meta, values[i]))
        # The caller owns what it gets back: RAM keeps its own copy. A snapshot (small;
        # the caller may sample from its logits in place) is copied now; blocks after the
        # restore has returned: their fresh memory faults in at ~0.3-0.5 s per GB, which
        # made a daemon's first restores after a restart wait ~4x their read time.
        blocks = [item for item in promote if item[1].kind == BLOCK]
        self._promote([item for item in promote if item[1].kind != BLOCK or at_once])
        if blocks and not at_once:
            self.promoter.submit(self._promote, blocks)

    def _into_ram(self, key: bytes, meta) -> bool:
        """Whether a value read from disk goes into RAM: a snapshot at once, a block on its
        second read in this process. The daemon keeps a restored block's page on the
        device, where the next prompts find it; copying it into RAM as well cost the
        restores that followed it (SmolLM2, ~820 tokens from disk, back to back: 75-85
        ms each beside the copies, 45-50 without). Called under the lock."""
        if meta.kind != BLOCK or key in self.read_once:
            self.read_once.discard(key)
            return True
        if len(self.read_once) >= _READ_ONCE_MAX:
            self.read_once.clear()
        self.read_once.add(key)
        return False

    def _promote(self, items: list) -> None:
        copies = [(k, m, {n: owned_copy(t) for n, t in v.items()}) for k, m, v in items]
        with self.catalog.lock:                      # deletes leave the index under it first
            for k, m, v in copies:
                if self.catalog.index.get(k) is not None:
                    self.host.put(k, m, v)

    def drop(self, keys: list[bytes], tier: str = DISK) -> None:
        """Values that failed verification: gone from every tier, never served. What
        is below them goes too, as a delete takes a subtree: a prefix stays closed.
        tier: where they were read from (recorded as where they failed)."""
        metas = dict(zip(keys, self.host.metas(keys)))
        with self.catalog.lock:
            self.catalog.counters.corrupt += len(keys)
            gone = list(dict.fromkeys(k for bad in keys for k in self.catalog.index.subtree(bad)))
            for k in gone:
                metas[k] = self.catalog.index.remove(k) or metas.get(k)
        self.gone.left(metas.items(), departures.CORRUPT, tier)
        for k in gone:
            self.host.delete(k)
        if not self.readonly:
            try:
                self.disk.delete_many(gone)
            except DiskFull:        # out of the index now; after a restart, caught again on read
                log.warning("cache: could not delete %d corrupt values: map full", len(gone))


def _ahead(items: list, fn, done: threading.Event) -> None:
    """fn over items, _AHEAD at a time, until the readers are done."""
    for s in range(0, len(items), _AHEAD):
        if done.is_set():
            return
        fn(items[s:s + _AHEAD])


def _write_ready(pages: list[torch.Tensor]) -> None:
    for t in pages:
        pagein.write_ready(t)

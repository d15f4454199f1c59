"""Loading a restore plan: RAM pieces are copied; disk pieces are read and decoded on
the reader pool straight into the output pages (two helpers run ahead of it: disk
read-ahead, output page faults), verified, and promoted into RAM. Remote pieces are
fetched all at once and decoded the same way (cache/store/remote_read.py), and handed
to `adopt`, which keeps them in LMDB (and a snapshot in RAM) for the next restore, once
the engine is idle."""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures

import lmdb
import torch

from ckptd.cache import codec_batch
from ckptd.cache.entry import BLOCK
from ckptd.cache.lookup import DEVICE, DISK, HOST, REMOTE, PieceRef, RestoredState, RestorePlan
from ckptd.cache.remote.ranges import CORRUPT, MISSING
from ckptd.cache.snapshot import Snapshot
from ckptd.cache.store import remote_read
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
        # what remote restores read, into LMDB once the engine is idle
        self.writes = remote_read.WriteThrough(self.promoter)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every restored block so far is promoted into RAM (and what remote
        restores read is handed to the writer)."""
        self.writes.idle_now()
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
        pieces, nb, run = plan.listed(), len(plan.blocks), plan.blocks.run
        if run is not None and self.fetcher is None:
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
            run_good, run_corrupt, run_missing = remote_read.load(
                self, plan, from_remote, into, values, remote_timeout, outs[nr:])
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

    def _read_group(self, job: list[tuple[PieceRef, dict | None]]) -> list:
        into = [out for _, out in job]

        def decode(got: list[tuple[bytes, memoryview | None]]) -> list:
            return self.decode_many([(k, buf, d) for (k, buf), d in zip(got, into)])
        try:
            return self.disk.read_batch([(ref.key, ref.kind) for ref, _ in job], decode)
        except lmdb.Error as e:
            # A damaged file can break LMDB's own pages: serve nothing from this group
            # (the restore falls back to the good prefix) rather than fail the request.
            log.warning("cache: disk read failed: %s", e)
            return [_MISSING] * len(job)

    def decode_many(self, items: list[tuple[bytes, memoryview | None, dict | None]]) -> list:
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

"""CacheStore: the store below the device tier, RAM and LMDB behind one door.

Values are named tensors. A block is {"kv": [n_attn, 2, B, kv_heads, head_dim]}
(StateSpec.kv_shape()); a snapshot (cache/snapshot.py) holds the recurrent state,
the partial page's KV and optionally the last logits. Reads try RAM, then disk;
writes go to RAM at once and to disk through the write-behind queue.

The store is its parts, each a small object with public methods:

    catalog     what is known of the entries, under one lock (catalog.py)
    reader      loads a restore plan (reader.py)
    committer   the writer thread's side: encode, make room, commit (commit.py)
    writer      the write-behind queue (writer.py)
    thinner     bounds the snapshots along a prefix (thin.py)
    admin       stats, listing, pins, deletes, verify, export (admin.py)
    remote      optional: the shared S3 tier below LMDB (cache/remote/), fed by the
                committer after each commit, read by the reader, planned last
    gone        records of the entries that left, and why (cache/why/gone.py): the
                parts record what they evict, thin, drop or could not write
    why         explains each restore and counts its misses (cache/why/ledger.py)

No part does LMDB I/O or compression while holding the catalog's lock.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ckptd.cache.entry import BLOCK, BRANCH, END, INTERVAL, SNAPSHOT, TAIL, EntryMeta
from ckptd.cache.keys import KeyChain, prompt_chain, root_key, snapshot_key
from ckptd.cache.lookup import RestoredState, RestorePlan, plan_restore
from ckptd.cache.snapshot import Snapshot, check_tensors
from ckptd.cache.store.admin import StoreAdmin
from ckptd.cache.store.catalog import Catalog
from ckptd.cache.store.commit import Committer
from ckptd.cache.store.config import StoreConfig
from ckptd.cache.store.index import DiskIndex
from ckptd.cache.store.reader import Reader
from ckptd.cache.store.remote_link import RemoteLink
from ckptd.cache.store.thin import Forget, Thinner
from ckptd.cache.store.writer import Writer
from ckptd.cache.tiers.disk import DiskFull, DiskTier
from ckptd.cache.tiers.host import HostTier, owned_copy, owned_rows, tensors_nbytes
from ckptd.cache.why.gone import BUDGET, EVICTED, Gone
from ckptd.cache.why.ledger import Ledger
from ckptd.model.spec import StateSpec

if TYPE_CHECKING:
    from ckptd.cache.remote.tier import RemoteTier

log = logging.getLogger(__name__)


class CacheStore:
    def __init__(self, path: str | Path, spec: StateSpec | None, fingerprint: str | None,
                 config: StoreConfig | None = None, *, readonly: bool = False,
                 remote: RemoteTier | None = None, **options) -> None:
        """remote: the shared tier below LMDB; the store closes it."""
        self.config = cfg = config or StoreConfig(**options)
        self.remote = remote
        self.path, self.spec, self.fp = Path(path), spec, fingerprint
        self.B = spec.block_size if spec is not None else None
        self.readonly = readonly
        self.closed = False
        self.disk = DiskTier(path, cfg.lmdb_map_bytes, readonly=readonly)
        # LMDB needs free pages beyond the values (copy-on-write, pages readers still
        # see): a map smaller than the budget caps what is stored at 2/3 of it.
        self.budget = min(cfg.disk_budget, self.disk.map_bytes() * 2 // 3)
        self.gone = Gone.load(self.path)
        if remote is not None:
            remote.gone = self.gone          # what it finds gone (cache/remote/lost.py)
        self.host = HostTier(0 if readonly else cfg.host_budget, self._host_evicted)
        self.catalog = Catalog(self._read_index(), self.host)
        self.why = Ledger(self.catalog, self.gone, fingerprint)
        self.committer = Committer(self.catalog, self.disk, fingerprint, self.budget,
                                   spec.is_hybrid if spec is not None else None,
                                   remote.offer if remote else None, self.gone)
        # Marking a put queued and queueing it happen together: a put that sees its
        # parent marked must find the parent ahead of it in the queue, or the writer
        # would drop it as an orphan (two threads putting one prefix at once).
        self.put_lock = threading.Lock()
        self.writer = None if readonly else Writer(
            self.committer.encode, self.committer.commit, cfg.queue_bytes, cfg.write_threads,
            cfg.batch, cfg.block_when_full, on_shed=self._shed)
        self.link = None if remote is None else RemoteLink(
            self.catalog, self.host, self.disk, self.writer, self.put_lock)
        self.reader = Reader(self.catalog, self.host, self.disk, spec, fingerprint,
                             cfg.read_threads, readonly, remote.fetcher if remote else None,
                             self.link.adopt if self.link else None, self.gone)
        self.thinner = Thinner(self.catalog, self.host, self.B, self._queue_forget, self.gone)
        self.admin = StoreAdmin(self)
        if remote is not None and not readonly:
            remote.attach(self.link.chain, self.link.values)

    @classmethod
    def open_readonly(cls, path: str | Path, spec: StateSpec | None = None,
                      fingerprint: str | None = None) -> CacheStore:
        """For a second process (the inspector) while the daemon writes. Every call
        sees the latest committed state; lookups need the spec and fingerprint."""
        return cls(path, spec, fingerprint, readonly=True)

    def root(self, salt: str | bytes | None = None) -> bytes:
        self.need_model()
        return root_key(self.fp, self.B, salt)

    def chain(self, tokens, salt: str | bytes | None = None, extras=None,
              positions=None, media: tuple = ()) -> KeyChain:
        """The block keys of `tokens` under this store's model and a salt. media: the
        spans of the prompt's images (model/vision/positions.py), named in the keys."""
        self.need_model()
        return prompt_chain(self.fp, self.B, tokens, salt, extras, positions, media)

    def need_model(self) -> None:
        if self.spec is None or self.fp is None:
            raise ValueError("this store was opened without a model spec and fingerprint")

    def writable(self) -> None:
        if self.readonly:
            raise ValueError("this store is open read-only")

    def sync(self) -> None:
        """A read-only store re-reads the index, which another process is writing."""
        if self.readonly:
            self.catalog.replace_index(self._read_index())

    def _read_index(self) -> DiskIndex:
        """The index as the file has it, closed: a record the scan left out (damaged)
        takes what is below it along."""
        index = DiskIndex(self.disk.scan())
        orphans = index.prune_orphans()
        if orphans:
            log.warning("cache: %d entries below a damaged index record dropped", len(orphans))
            if not self.readonly:
                try:
                    self.disk.delete_many(orphans)
                except DiskFull as e:     # out of the index: never planned, never served
                    log.warning("cache: could not delete them from the file: %s", e)
        return index

    def has(self, key: bytes) -> bool:
        """Whether the key is in RAM, on disk or on its way there."""
        return self.catalog.has(key)

    def lookup(self, tokens, salt: str | bytes | None = None, extras=None,
               max_tokens: int | None = None, positions=None,
               device_blocks: int = 0, chain: KeyChain | None = None) -> RestorePlan:
        """The deepest restorable state of `tokens` that covers at most max_tokens
        tokens (pass len(tokens) - 1 to keep one token to compute). device_blocks: the
        first blocks the caller holds on its device (tokens checked). chain: the
        prompt's block keys when the caller has them (hashed otherwise)."""
        self.need_model()
        tokens = _ints(tokens)
        limit = len(tokens) if max_tokens is None else max(0, min(max_tokens, len(tokens)))
        if chain is None:
            chain = self.chain(tokens[:limit], salt, extras, positions)
        self.sync()
        plan = plan_restore(tokens, limit, chain, self.spec.is_hybrid, self.catalog,
                            device_blocks)
        cat = self.catalog
        with cat.lock:
            cat.counters.lookups += 1
            cat.counters.hit_tokens += plan.position
            cat.counters.hits += int(plan.position > 0)
        return plan

    def lookup_remote(self, tokens: list[int], limit: int, chain: KeyChain,
                      device_blocks: int = 0, floor: int = 0) -> RestorePlan | None:
        """The deepest state of tokens[:limit] with the remote tier's pieces added to the
        local ones; None when there is no remote or it is cooling off. floor: the
        position the local tiers restore alone."""
        if self.remote is None:
            return None
        self.need_model()
        return self.remote.plan(self.catalog, _ints(tokens), limit, chain, device_blocks,
                                floor)

    def load(self, plan: RestorePlan, into_pages: list[torch.Tensor] | None = None,
             remote_timeout: float | None = None) -> RestoredState:
        """A plan's tensors (cache/store/reader.py); the snapshot as a Snapshot.
        remote_timeout: seconds the remote pieces may take (default: the remote's
        fetch_timeout); those still out then count as missing."""
        self.need_model()
        if remote_timeout is None:
            remote_timeout = self.remote.config.fetch_timeout if self.remote else 0.0
        return self.reader.load(plan, into_pages, remote_timeout)

    def put_blocks(self, tokens, first_block: int, pages: torch.Tensor,
                   salt: str | bytes | None = None, extras=None, positions=None,
                   chain: KeyChain | None = None) -> int:
        """Store pages [n, *kv_shape()] as blocks first_block .. first_block+n-1 of
        `tokens` (chain: their block keys, when the caller has them). Returns how many
        were new."""
        self.writable()
        self.need_model()
        n = pages.shape[0] if pages.dim() else 0
        if tuple(pages.shape[1:]) != self.spec.kv_shape() or pages.dtype != self.spec.kv_dtype:
            raise ValueError(f"pages must be [n, {', '.join(map(str, self.spec.kv_shape()))}] "
                             f"{self.spec.kv_dtype}, got {list(pages.shape)} {pages.dtype}")
        tokens = _ints(tokens)        # not a copy: a checkpoint of 1 block at 64K stores 1
        end = (first_block + n) * self.B
        if first_block < 0 or len(tokens) < end:
            raise ValueError(f"blocks {first_block}..{first_block + n - 1} need "
                             f"{end} tokens, got {len(tokens)}")
        if chain is None:
            chain = self.chain(tokens[:end], salt, extras, positions)
        elif len(chain) < first_block + n:
            raise ValueError(f"the key chain holds {len(chain)} blocks, need {first_block + n}")
        ctx, root, keys = chain.ctx, chain.root, chain.keys
        todo = [j for j in range(n) if not self.catalog.known(keys[first_block + j])]
        new = 0
        for j, page in zip(todo, owned_rows(pages, todo), strict=True):
            i = first_block + j
            meta = EntryMeta(BLOCK, keys[i - 1] if i else root, (i + 1) * self.B,
                             tokens[i * self.B:(i + 1) * self.B], self.fp,
                             plain=ctx.plain(i, self.B))
            new += self._put(keys[i], meta, {"kv": page})
        return new

    def put_snapshot(self, tokens, snapshot: Snapshot, salt: str | bytes | None = None,
                     extras=None, positions=None, keep: int | None = None,
                     chain: KeyChain | None = None, role: str = END) -> bytes:
        """Store the state after exactly `tokens`. Returns its key. With `keep`, a new
        snapshot thins the older ones on its path to at most `keep` in all
        (cache/store/thin.py). role: why it was taken (cache/entry.py); interval ones
        are thinned and shed first; a branch point drops the tail snapshots it replaces."""
        if role not in (INTERVAL, END, BRANCH, TAIL):
            raise ValueError(f"a snapshot's role is one of interval, end, branch, tail; "
                             f"got {role!r}")
        self.writable()
        self.need_model()
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        tokens = _ints(tokens)
        tensors = snapshot.tensors()
        check_tensors(self.spec, len(tokens), tensors)
        d = len(tokens) // self.B
        if chain is None:
            chain = self.chain(tokens[:d * self.B], salt, extras, positions)
        elif len(chain) < d:
            raise ValueError(f"the key chain holds {len(chain)} blocks, need {d}")
        ctx = chain.ctx
        parents = [chain.root, *chain.keys[:d]]
        parent = parents[-1]
        tail = [int(t) for t in tokens[d * self.B:]]
        key = snapshot_key(parent, tail, d, self.B, ctx)
        if not self.catalog.known(key):
            if ctx.inside_image(len(tokens)):
                raise ValueError(f"a snapshot at {len(tokens)} would fall inside an image")
            meta = EntryMeta(SNAPSHOT, parent, len(tokens), tail, self.fp,
                             plain=ctx.plain(d, self.B), role=role,
                             next_position=ctx.next_position(len(tokens)) if ctx.media
                             else None)
            self._put(key, meta, {k: owned_copy(v) for k, v in tensors.items()})
            if role == BRANCH:
                self.thinner.replace_tails(tokens, parents, ctx)
            if keep is not None:
                self.thinner.thin(tokens, parents, keep, ctx)
        return key

    def forget(self, keys) -> int:
        """Drop snapshots from every tier (cache/store/thin.py)."""
        self.writable()
        return self.thinner.forget(keys)

    def _put(self, key: bytes, meta: EntryMeta, tensors: dict[str, torch.Tensor]) -> bool:
        meta.logical_bytes = tensors_nbytes(tensors)
        self.host.put(key, meta, tensors)
        cat = self.catalog
        with self.put_lock:
            with cat.lock:
                cat.queued[key] = meta.parent
            if self.writer.put((key, meta, tensors), meta.logical_bytes,
                               priority=1 if meta.kind == BLOCK or meta.shed_last else 0,
                               label=meta.role or meta.kind):
                return True
            with cat.lock:
                cat.queued.pop(key, None)
        self.gone.left([(key, meta)], BUDGET, "disk", _QUEUE_FULL)
        return False

    def _shed(self, item) -> None:
        """The writer shed a queued put to make room: it is no longer on its way."""
        key = item[0]
        with self.catalog.lock:
            self.catalog.queued.pop(key, None)
        self.gone.left([(key, item[1])], BUDGET, "disk", _QUEUE_FULL)

    def _host_evicted(self, items: list[tuple[bytes, EntryMeta]]) -> None:
        """The RAM tier evicted these: the last copy of those that are not on disk or on
        their way (read without the catalog's lock, which the RAM tier's must not wait
        for: a racing commit at worst leaves a record of an entry that is there, and
        records are read only for entries that are not)."""
        cat = self.catalog
        lost = [(k, m) for k, m in items if k not in cat.index and k not in cat.queued]
        if lost:
            self.gone.left(lost, EVICTED, "host", "over the RAM tier's budget", unless=BUDGET)

    def _queue_forget(self, item: Forget) -> None:
        with self.put_lock:
            self.writer.put(item, 0, counted=False)

    def stats(self) -> dict:
        return self.admin.stats()

    def entries(self, *args, **kw):
        return self.admin.entries(*args, **kw)

    def get_info(self, key_hex: str):
        return self.admin.get_info(key_hex)

    def delete(self, key_hex: str) -> int:
        return self.admin.delete(key_hex)

    def pin(self, key_hex: str) -> int:
        return self.admin.pin(key_hex)

    def unpin(self, key_hex: str) -> int:
        return self.admin.unpin(key_hex)

    def clear(self, include_pinned: bool = False) -> int:
        return self.admin.clear(include_pinned)

    def evict_to(self, target_bytes: int, hybrid: bool | None = None) -> dict:
        return self.admin.evict_to(target_bytes, hybrid)

    def verify(self, drop: bool = False):
        return self.admin.verify(drop)

    def export(self, path: str | Path) -> int:
        return self.admin.export(path)

    def import_(self, path: str | Path) -> int:
        return self.admin.import_(path)

    def sanity_check(self) -> None:
        """The invariants of the index and the RAM tier (AssertionError names what
        broke)."""
        self.catalog.sanity_check()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every put so far is on disk (or dropped), and every restored block
        so far is promoted into RAM; True unless timed out."""
        if not self.reader.flush(timeout):
            return False
        return True if self.writer is None else self.writer.flush(timeout)

    def close(self) -> None:
        """Commit everything queued and close; a second call does nothing."""
        if self.closed:
            return
        self.closed = True
        self.reader.flush(30)          # what restores read from the remote, into the queue
        if self.writer is not None:
            self.writer.close()
            touched = self.catalog.take_touched()
            if touched:
                self.disk.update_meta(touched)
        if self.remote is not None:
            self.remote.close()        # after the writer: its last commits go up too
        self.reader.close()
        self.disk.close()
        if not self.readonly:
            self.gone.save(self.path)

    def __enter__(self) -> CacheStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_QUEUE_FULL = "the write queue was full (the disk writer fell behind)"


def _ints(tokens) -> list[int]:
    """tokens as a list of ints. The daemon's lists pass as they are: converting a
    long prompt again costs time on every call, and it makes several calls."""
    return tokens if type(tokens) is list else list(map(int, tokens))


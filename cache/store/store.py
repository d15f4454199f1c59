"""CacheStore: the cache's one entry point (lookup, load, put; admin in admin.py).

Values are named tensors. A block is {"kv": [n_attn, 2, B, kv_heads, head_dim]}
(StateSpec.kv_shape()); a snapshot at P holds "conv" and "ssm" (recurrent layers),
"kv" for its partial page (attention layers, P mod B tokens) and optionally
"logits" of the last position. Reads try RAM, then disk; writes go to RAM at once
and to disk through the write-behind queue.

Locking: `self.lock` guards the in-memory structures only (index, touched,
queued, counters); LMDB I/O and compression always run outside it.
"""

from __future__ import annotations

import threading
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from ckptd.cache.entry import BLOCK, SNAPSHOT, EntryMeta
from ckptd.cache.keys import KeyContext, block_keys, root_key, snapshot_key
from ckptd.cache.lookup import DISK, HOST, RestorePlan, plan_restore
from ckptd.cache.store.admin import Counters, StoreAdmin
from ckptd.cache.store.commit import StoreCommit
from ckptd.cache.store.index import DiskIndex
from ckptd.cache.store.restore import StoreRestore
from ckptd.cache.store.thin import StoreThin
from ckptd.cache.store.writer import Writer
from ckptd.cache.tiers.disk import DiskTier
from ckptd.cache.tiers.host import HostTier, tensors_nbytes
from ckptd.model.spec import StateSpec


@dataclass(frozen=True)
class StoreConfig:
    disk_budget: int = 20 << 30       # bytes of stored (compressed) values on disk
    host_budget: int = 2 << 30        # bytes of uncompressed tensors in RAM
    queue_bytes: int = 256 << 20      # write-behind queue bound (logical bytes)
    block_when_full: bool = False     # a full queue blocks the put instead of dropping it
    read_threads: int = 2
    write_threads: int = 2
    batch: int = 64                   # entries per LMDB write transaction
    map_bytes: int | None = None      # LMDB map; default: room for the budget plus slack

    def __post_init__(self) -> None:
        for name in ("disk_budget", "host_budget", "queue_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("read_threads", "write_threads", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def lmdb_map_bytes(self) -> int:
        # LMDB needs room beyond the values: tree pages, and freed pages that old
        # readers still see. Budget + 50% + 64 MiB has been enough in the budget tests.
        return self.map_bytes or int(self.disk_budget * 1.5) + (64 << 20)


class CacheStore(StoreRestore, StoreCommit, StoreThin, StoreAdmin):
    def __init__(self, path: str | Path, spec: StateSpec | None, fingerprint: str | None,
                 config: StoreConfig | None = None, *, readonly: bool = False,
                 **options) -> None:
        self.config = cfg = config or StoreConfig(**options)
        self.path, self.spec, self.fp = Path(path), spec, fingerprint
        self.B = spec.block_size if spec is not None else None
        self.readonly = readonly
        self.closed = False
        self.disk = DiskTier(path, cfg.lmdb_map_bytes, readonly=readonly)
        # LMDB needs free pages beyond the values (copy-on-write, pages readers still
        # see): a map smaller than the budget caps what is stored at 2/3 of it.
        self.budget = min(cfg.disk_budget, self.disk.map_bytes() * 2 // 3)
        self.host = HostTier(0 if readonly else cfg.host_budget)
        self.lock = threading.Lock()
        self.index = DiskIndex(self.disk.scan())
        self.touched: dict[bytes, EntryMeta] = {}     # hits not yet written to disk
        self.queued: dict[bytes, bytes] = {}          # key -> parent, for puts in the queue
        self.forgetting: set[bytes] = set()           # forgotten, their disk delete queued
        # Marking a put queued and queueing it happen together: a put that sees its
        # parent marked must find the parent ahead of it in the queue, or the writer
        # would drop it as an orphan (two threads putting one prefix at once).
        self.put_lock = threading.Lock()
        self.counters = Counters()
        self.readers = ThreadPoolExecutor(cfg.read_threads, thread_name_prefix="ckptd-read")
        # A restore's read-ahead helpers, beside the readers (hints: loads don't wait on them).
        self.prefetcher = ThreadPoolExecutor(2, thread_name_prefix="ckptd-prefetch")
        # Copies of restored blocks into RAM, made after the restore returns (restore.py),
        # of blocks read from disk once before in this process (`read_once`).
        self.promoter = ThreadPoolExecutor(1, thread_name_prefix="ckptd-promote")
        self.read_once: set[bytes] = set()
        self.writer = None if readonly else Writer(
            self._encode, self._commit, cfg.queue_bytes, cfg.write_threads, cfg.batch,
            cfg.block_when_full)

    @classmethod
    def open_readonly(cls, path: str | Path, spec: StateSpec | None = None,
                      fingerprint: str | None = None) -> CacheStore:
        """For a second process (the inspector) while the daemon writes. Every call
        sees the latest committed state; lookups need the spec and fingerprint."""
        return cls(path, spec, fingerprint, readonly=True)

    def root(self, salt: str | bytes | None = None) -> bytes:
        self._need_model()
        return root_key(self.fp, self.B, salt)

    def _need_model(self) -> None:
        if self.spec is None or self.fp is None:
            raise ValueError("this store was opened without a model spec and fingerprint")

    def _sync(self) -> None:
        """A read-only store re-reads the index, which another process is writing."""
        if self.readonly:
            index = DiskIndex(self.disk.scan())
            with self.lock:
                self.index = index

    # ---- lookup and load ----------------------------------------------------------
    def lookup(self, tokens, salt: str | bytes | None = None, extras=None,
               max_tokens: int | None = None, positions=None,
               device_blocks: int = 0) -> RestorePlan:
        """The deepest restorable state of `tokens` that covers at most max_tokens
        tokens (pass len(tokens) - 1 to keep one token to compute). device_blocks: the
        first blocks the caller holds on its device (tokens checked): planned as
        blocks of the "device" tier, whether the store has them or not."""
        self._need_model()
        tokens = _ints(tokens)
        limit = len(tokens) if max_tokens is None else max(0, min(max_tokens, len(tokens)))
        self._sync()
        plan = self._plan(tokens, limit, KeyContext(salt, extras, positions), device_blocks)
        with self.lock:
            self.counters.lookups += 1
            self.counters.hit_tokens += plan.position
            self.counters.hits += int(plan.position > 0)
        return plan

    def _plan(self, tokens: list[int], limit: int, ctx: KeyContext,
              device_blocks: int = 0) -> RestorePlan:
        return plan_restore(tokens, limit, self.root(ctx.salt), self.B, self.spec.is_hybrid,
                            ctx, self, device_blocks)

    # The IndexView that planning reads (cache/lookup.py): RAM first, then disk.
    def find_many(self, keys) -> list[tuple[EntryMeta, str] | None]:
        out: list = [None if m is None else (m, HOST) for m in self.host.metas(keys)]
        with self.lock:
            for i, key in enumerate(keys):
                if out[i] is None and (meta := self.index.get(key)) is not None:
                    out[i] = (meta, DISK)
        return out

    def with_snapshots(self, parents) -> set[bytes]:
        with self.lock:
            found = {p for p in parents if p in self.index.snap_parents}
        return found | self.host.with_snapshots(parents)

    def children_after(self, parent: bytes) -> list[tuple[bytes, EntryMeta, str]]:
        with self.lock:
            found = {k: (k, m, DISK) for k, m in self.index.children_after(parent)}
        found.update({k: (k, m, HOST) for k, m in self.host.children_after(parent)})
        return list(found.values())

    # ---- puts ---------------------------------------------------------------------
    def put_blocks(self, tokens, first_block: int, pages: torch.Tensor,
                   salt: str | bytes | None = None, extras=None, positions=None) -> int:
        """Store pages [n, *kv_shape()] as blocks first_block .. first_block+n-1 of
        `tokens`. Returns how many were new."""
        self._writable()
        self._need_model()
        a = self.spec.attention
        n = pages.shape[0] if pages.dim() else 0
        if a is None or tuple(pages.shape[1:]) != self.spec.kv_shape() or pages.dtype != a.dtype:
            raise ValueError(f"pages must be [n, {', '.join(map(str, self.spec.kv_shape()))}] "
                             f"{a.dtype if a else 'of an attention model'}, "
                             f"got {list(pages.shape)} {pages.dtype}")
        tokens = [int(t) for t in tokens[:(first_block + n) * self.B]]
        if first_block < 0 or len(tokens) < (first_block + n) * self.B:
            raise ValueError(f"blocks {first_block}..{first_block + n - 1} need "
                             f"{(first_block + n) * self.B} tokens, got {len(tokens)}")
        ctx = KeyContext(salt, extras, positions)
        root = self.root(salt)
        keys = block_keys(root, tokens, self.B, ctx)
        new = 0
        for j in range(n):
            i = first_block + j
            if self._known(keys[i]):
                continue
            meta = EntryMeta(BLOCK, keys[i - 1] if i else root, (i + 1) * self.B,
                             tokens[i * self.B:(i + 1) * self.B], self.fp,
                             plain=ctx.plain(i, self.B))
            new += self._put(keys[i], meta, {"kv": pages[j].detach().clone()})
        return new

    def put_snapshot(self, tokens, tensors: dict[str, torch.Tensor],
                     salt: str | bytes | None = None, extras=None, positions=None,
                     keep: int | None = None) -> bytes:
        """Store the state after exactly `tokens`: conv, ssm (recurrent layers), kv of the
        partial page (P mod B tokens) and optionally logits. Returns its key. With
        `keep`, a new snapshot thins the older ones on its path to at most `keep` in
        all (cache/thin.py)."""
        self._writable()
        self._need_model()
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        tokens = _ints(tokens)
        self._check_snapshot(len(tokens), tensors)
        d = len(tokens) // self.B
        ctx = KeyContext(salt, extras, positions)
        root = self.root(salt)
        parents = [root, *block_keys(root, tokens[:d * self.B], self.B, ctx)]
        parent = parents[-1]
        tail = [int(t) for t in tokens[d * self.B:]]
        key = snapshot_key(parent, tail, d, self.B, ctx)
        if not self._known(key):
            meta = EntryMeta(SNAPSHOT, parent, len(tokens), tail, self.fp,
                             plain=ctx.plain(d, self.B))
            self._put(key, meta, {k: v.detach().clone() for k, v in tensors.items()})
            if keep is not None:
                self._thin(tokens, parents, keep, ctx)
        return key

    def _check_snapshot(self, P: int, tensors: dict[str, torch.Tensor]) -> None:
        s = self.spec
        want = {}
        if s.recurrent is not None:
            want["conv"] = (s.conv_shape(), s.recurrent.conv_dtype)
            want["ssm"] = (s.ssm_shape(), s.recurrent.ssm_dtype)
        if s.attention is not None and P % self.B:
            want["kv"] = (s.kv_shape(P % self.B), s.attention.dtype)
        if P == 0:
            raise ValueError("a snapshot covers at least one token")
        extra = set(tensors) - set(want) - {"logits"}
        if extra or not set(want) <= set(tensors) or not tensors:
            raise ValueError(f"a snapshot at {P} holds {sorted(want)} (+ optional logits), "
                             f"got {sorted(tensors)}")
        for name, (shape, dtype) in want.items():
            t = tensors[name]
            if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
                raise ValueError(f"snapshot {name!r} must be {list(shape)} {dtype}, "
                                 f"got {list(t.shape)} {t.dtype}")

    def _writable(self) -> None:
        if self.readonly:
            raise ValueError("this store is open read-only")

    def _known(self, key: bytes) -> bool:
        """On disk or on its way there. An entry only in RAM (its write was dropped, or
        it was evicted from disk) is put again: a second chance to persist."""
        with self.lock:
            return key in self.index or key in self.queued

    def _put(self, key: bytes, meta: EntryMeta, tensors: dict[str, torch.Tensor]) -> bool:
        meta.logical_bytes = tensors_nbytes(tensors)
        self.host.put(key, meta, tensors)
        with self.put_lock:
            with self.lock:
                self.queued[key] = meta.parent
            if self.writer.put((key, meta, tensors), meta.logical_bytes):
                return True
            with self.lock:
                self.queued.pop(key, None)
        return False

    # ---- lifecycle ----------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every put so far is on disk (or dropped), and every restored block
        so far is promoted into RAM; True unless timed out."""
        try:
            self.promoter.submit(lambda: None).result(timeout)
        except futures.TimeoutError:
            return False
        except RuntimeError:                 # closed: nothing is pending
            pass
        return True if self.writer is None else self.writer.flush(timeout)

    def close(self) -> None:
        """Commit everything queued and close; a second call does nothing."""
        if self.closed:
            return
        self.closed = True
        if self.writer is not None:
            self.writer.close()
            with self.lock:
                touched, self.touched = self.touched, {}
            if touched:
                self.disk.update_meta(touched)
        self.readers.shutdown()
        self.prefetcher.shutdown()
        self.promoter.shutdown()
        self.disk.close()

    def __enter__(self) -> CacheStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ints(tokens) -> list[int]:
    """tokens as a list of ints. The daemon's lists pass as they are: converting a
    long prompt again costs ~1 ms per call (16K tokens), and it makes several calls."""
    return tokens if type(tokens) is list else list(map(int, tokens))

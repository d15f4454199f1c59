"""CacheStore: the cache's one entry point (lookup, load, put, admin).

Values are named tensors: a block is {"kv": [n_attn, 2, B, Hkv, D]}; a snapshot
holds "conv" and "ssm" (recurrent layers), "kv" for its partial page (attention
layers, P mod B tokens) and optionally "logits". Reads try the RAM tier, then
disk; writes go to RAM at once and to disk through the write-behind queue.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cache import codec
from cache.disk import DiskTier
from cache.entry import BLOCK, SNAPSHOT, EntryMeta
from cache.evict import pick_victims
from cache.host import HostTier, tensors_nbytes
from cache.keys import block_keys, root_key, snapshot_key
from cache.writer import Writer
from model.spec import StateSpec


@dataclass
class PieceRef:
    key: bytes
    tier: str          # "host" or "disk"
    nbytes: int        # stored bytes (compressed on disk)


@dataclass
class RestorePlan:
    position: int                     # tokens the restored state covers
    blocks: list[PieceRef]            # blocks 0 .. position // B - 1
    snapshot: PieceRef | None         # state at exactly `position` (needed by hybrids)
    snapshot_position: int = 0        # where the snapshot was taken; > position when an
                                      # attention-only model uses a prefix of its partial page

    def bytes_by_tier(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in [*self.blocks, *([self.snapshot] if self.snapshot else [])]:
            out[p.tier] = out.get(p.tier, 0) + p.nbytes
        return out

    @property
    def tier(self) -> str | None:
        tiers = self.bytes_by_tier()
        return "disk" if "disk" in tiers else ("host" if tiers else None)


@dataclass
class Restored:
    position: int
    pages: torch.Tensor | None                 # [n_blocks, *spec.kv_shape()]
    snapshot: dict[str, torch.Tensor] | None
    ok: bool = True                            # False: a piece failed and was dropped; re-plan


@dataclass
class Counters:
    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    evicted: int = 0
    extra: dict = field(default_factory=dict)


class CacheStore:
    def __init__(self, path: str | Path, spec: StateSpec, fingerprint: str,
                 disk_budget: int = 20 << 30, host_budget: int = 2 << 30,
                 queue_bytes: int = 512 << 20, readonly: bool = False) -> None:
        self.spec, self.fp, self.B = spec, fingerprint, spec.block_size
        self.disk = DiskTier(path, disk_budget, readonly=readonly)
        self.host = HostTier(0 if readonly else host_budget)
        self.counters = Counters()
        self.lock = threading.Lock()
        self.touched: dict[bytes, EntryMeta] = {}
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="ckptd-read")
        self.disk_bytes = self.disk.stored_bytes()
        self.writer = None if readonly else Writer(self._commit, self._encode, queue_bytes)

    @classmethod
    def open_readonly(cls, path: str | Path) -> CacheStore:
        """For a second process (the inspector) while the daemon writes; no spec needed."""
        self = cls.__new__(cls)
        self.spec, self.fp, self.B = None, None, None
        self.disk = DiskTier(path, 0, readonly=True)
        self.host = HostTier(0)
        self.counters, self.lock, self.touched = Counters(), threading.Lock(), {}
        self.pool = ThreadPoolExecutor(2)
        self.disk_bytes = self.disk.stored_bytes()
        self.writer = None
        return self

    # ---- lookup and load -------------------------------------------------------------
    def root(self, salt: str | bytes | None = None) -> bytes:
        return root_key(self.fp, self.B, salt)

    def _find(self, key: bytes) -> tuple[EntryMeta, str] | None:
        m = self.host.meta(key)
        if m is not None:
            return m, "host"
        m = self.disk.meta(key)
        return None if m is None else (m, "disk")

    def _ref(self, key: bytes, meta: EntryMeta, tier: str) -> PieceRef:
        return PieceRef(key, tier, meta.stored_bytes if tier == "disk" else meta.logical_bytes)

    def lookup(self, tokens: list[int], salt: str | bytes | None = None,
               max_tokens: int | None = None) -> RestorePlan:
        """The deepest restorable state of `tokens` covering at most max_tokens tokens."""
        limit = len(tokens) if max_tokens is None else max(0, min(max_tokens, len(tokens)))
        root = self.root(salt)
        keys = block_keys(root, tokens[:limit], self.B)
        blocks: list[PieceRef] = []
        for i, k in enumerate(keys):
            found = self._find(k)
            if found is None or found[0].kind != BLOCK or \
                    found[0].tokens != tokens[i * self.B:(i + 1) * self.B]:
                break
            blocks.append(self._ref(k, *found))
        snap = self._best_snapshot(tokens, root, keys, len(blocks), limit)
        if snap is not None:
            position, ref, taken_at = snap
            plan = RestorePlan(position, blocks[:position // self.B], ref, taken_at)
        elif self.spec.is_hybrid:
            plan = RestorePlan(0, [], None)
        else:
            plan = RestorePlan(len(blocks) * self.B, blocks, None)
        with self.lock:
            if plan.position:
                self.counters.hits += 1
            else:
                self.counters.misses += 1
        return plan

    def _best_snapshot(self, tokens, root, keys, depth, limit):
        """(position, snapshot ref, position it was taken at) or None."""
        for d in range(depth, -1, -1):
            parent = keys[d - 1] if d else root
            cands = {k: r for r, k in self.disk.snapshots_after(parent)}
            cands.update({k: len(m.tokens) for k, m in self.host.scan()
                          if m.kind == SNAPSHOT and m.parent == parent.hex()})
            if not self.spec.is_hybrid:
                return self._best_partial(tokens, d, cands, limit)
            for key, r in sorted(cands.items(), key=lambda kv: -kv[1]):
                pos = d * self.B + r
                if r >= self.B or pos > limit:
                    continue
                tail = tokens[d * self.B:pos]
                found = self._find(key)
                if found is None or snapshot_key(parent, tail) != key or found[0].tokens != tail:
                    continue
                return pos, self._ref(key, *found), pos
        return None

    def _best_partial(self, tokens, d, cands, limit):
        """Attention-only: KV can be cut anywhere, so any snapshot after block d serves the
        part of its partial page that matches the prompt (tokens compared)."""
        want = tokens[d * self.B:min(limit, (d + 1) * self.B)]
        best = None
        for key in cands:
            found = self._find(key)
            if found is None:
                continue
            have = found[0].tokens
            m = 0
            while m < min(len(have), len(want)) and have[m] == want[m]:
                m += 1
            full = m == len(have)          # an aligned snapshot (empty tail) matches fully
            if (m or full) and (best is None or (m, full) > best[:2]):
                best = (m, full, self._ref(key, *found), d * self.B + len(have))
        return None if best is None else (d * self.B + best[0], best[2], best[3])

    def load(self, plan: RestorePlan) -> Restored:
        refs = [*plan.blocks, *([plan.snapshot] if plan.snapshot else [])]
        values = list(self.pool.map(self._read, refs))
        bad = [r.key for r, v in zip(refs, values) if v is None]
        if bad:
            self._drop(bad)
            return Restored(0, None, None, ok=False)
        now = time.time()
        for ref in refs:
            found = self._find(ref.key)
            if found:
                m = found[0]
                m.hits += 1
                m.last_used = now
                with self.lock:
                    self.touched[ref.key] = m
        n = len(plan.blocks)
        pages = torch.stack([v["kv"] for v in values[:n]]) if n else None
        snap = dict(values[n]) if plan.snapshot else None
        if snap and plan.snapshot_position != plan.position:
            snap.pop("logits", None)                 # they belong to the full snapshot
            snap["kv"] = snap["kv"][:, :, :plan.position % self.B]
        return Restored(plan.position, pages, snap)

    def _read(self, ref: PieceRef) -> dict[str, torch.Tensor] | None:
        item = self.host.get(ref.key)
        if item is not None:
            return item[1]
        blob = self.disk.get(ref.key)
        meta = self.disk.meta(ref.key)
        if blob is None or meta is None:
            return None
        try:
            tensors = codec.decode(blob, self.fp)
        except codec.CorruptValue:
            return None
        self.host.put(ref.key, meta, tensors)
        return tensors

    def _drop(self, keys: list[bytes]) -> None:
        with self.lock:
            self.counters.corrupt += len(keys)
        for k in keys:
            self.host.delete(k)
        if not self.disk.readonly:
            self._delete_disk(keys)

    # ---- puts ---------------------------------------------------------------------
    def put_blocks(self, tokens: list[int], first_block: int, pages: torch.Tensor,
                   salt: str | bytes | None = None) -> int:
        """Store pages [n, *kv_shape] as blocks first_block .. first_block + n - 1 of
        `tokens`. Returns how many were new."""
        n = pages.shape[0]
        root = self.root(salt)
        keys = block_keys(root, tokens[:(first_block + n) * self.B], self.B)
        new = 0
        for j in range(n):
            i = first_block + j
            if self._find(keys[i]) is not None:
                continue
            parent = keys[i - 1] if i else root
            meta = EntryMeta(BLOCK, parent.hex(), (i + 1) * self.B,
                             list(tokens[i * self.B:(i + 1) * self.B]), self.fp)
            self._put(keys[i], meta, {"kv": pages[j].detach().clone()})
            new += 1
        return new

    def put_snapshot(self, tokens: list[int], tensors: dict[str, torch.Tensor],
                     salt: str | bytes | None = None) -> bytes:
        """Store the state after exactly `tokens`."""
        P = len(tokens)
        d = P // self.B
        root = self.root(salt)
        parent = block_keys(root, tokens[:d * self.B], self.B)[-1] if d else root
        tail = list(tokens[d * self.B:])
        key = snapshot_key(parent, tail)
        if self._find(key) is None:
            meta = EntryMeta(SNAPSHOT, parent.hex(), P, tail, self.fp)
            self._put(key, meta, {k: v.detach().clone() for k, v in tensors.items()})
        return key

    def _put(self, key: bytes, meta: EntryMeta, tensors: dict[str, torch.Tensor]) -> None:
        meta.logical_bytes = tensors_nbytes(tensors)
        self.host.put(key, meta, tensors)
        self.writer.put((key, meta, tensors), meta.logical_bytes)

    def _encode(self, item):
        key, meta, tensors = item
        blob = codec.encode(tensors, self.fp)
        meta.stored_bytes = len(blob)
        return key, meta, blob

    def _commit(self, encoded: list) -> None:
        with self.lock:
            touched, self.touched = self.touched, {}
        added = self.disk.put_many(encoded)
        if touched:
            self.disk.update_meta(touched)
        with self.lock:
            self.disk_bytes += added
        if self.disk_bytes > self.disk.budget:
            self.evict_to(self.disk.budget)

    # ---- admin ----------------------------------------------------------------------
    def evict_to(self, budget: int) -> int:
        """Evict least-recently-used unpinned leaves until stored bytes <= budget."""
        entries = self.disk.scan()
        victims = pick_victims(entries, self.disk_bytes - budget)
        if victims:
            self._delete_disk(victims)
            with self.lock:
                self.counters.evicted += len(victims)
        return len(victims)

    def _delete_disk(self, keys: list[bytes]) -> None:
        metas = [self.disk.meta(k) for k in keys]
        self.disk.delete_many(keys)
        with self.lock:
            self.disk_bytes -= sum(m.stored_bytes for m in metas if m)

    def entries(self, offset: int = 0, limit: int = 100, sort: str = "last_used"):
        if sort not in ("last_used", "size", "hits", "created"):
            raise ValueError(f"sort must be last_used, size, hits or created, got {sort!r}")
        merged = {k: (m, "disk") for k, m in self.disk.scan()}
        merged.update({k: (m, "host+disk" if k in merged else "host") for k, m in self.host.scan()})
        attr = {"size": "stored_bytes"}.get(sort, sort)
        rows = sorted(merged.items(), key=lambda kv: -getattr(kv[1][0], attr))
        return [(k, m, t) for k, (m, t) in rows[offset:offset + limit]], len(rows)

    def info(self, key: bytes) -> tuple[EntryMeta, str] | None:
        return self._find(key)

    def subtree(self, key: bytes) -> list[bytes]:
        entries = {**dict(self.disk.scan()), **dict(self.host.scan())}
        children: dict[str, list[bytes]] = {}
        for k, m in entries.items():
            children.setdefault(m.parent, []).append(k)
        out, todo = [], [key] if key in entries else []
        while todo:
            k = todo.pop()
            out.append(k)
            todo += children.get(k.hex(), [])
        return out

    def delete(self, key: bytes) -> int:
        """Delete an entry and everything below it (a prefix stays closed)."""
        keys = self.subtree(key)
        for k in keys:
            self.host.delete(k)
        self._delete_disk(keys)
        return len(keys)

    def set_pinned(self, key: bytes, pinned: bool) -> int:
        """Pin an entry and its ancestors (unpin: the entry alone). Returns entries changed."""
        self.flush()
        changed, k = {}, key
        while k is not None:
            found = self._find(k)
            if found is None:
                break
            m = found[0]
            m.pinned = pinned
            changed[k] = m
            k = bytes.fromhex(m.parent) if pinned else None
        self.disk.update_meta(changed)
        return len(changed)

    def clear(self, include_pinned: bool = False) -> int:
        self.flush()
        keys = [k for k, m in self.disk.scan() if include_pinned or not m.pinned]
        for k in keys:
            self.host.delete(k)
        if include_pinned:
            self.host.clear()
        self._delete_disk(keys)
        return len(keys)

    def verify(self, drop: bool = False) -> dict:
        bad = []
        entries = self.disk.scan()
        for k, _ in entries:
            blob = self.disk.get(k)
            try:
                codec.decode(blob, None)
            except codec.CorruptValue:
                bad.append(k)
        if drop and bad:
            self._drop(bad)
        return {"checked": len(entries), "bad": [k.hex() for k in bad], "dropped": drop}

    def stats(self) -> dict:
        entries = self.disk.scan()
        by_kind: dict[str, int] = {}
        by_fp: dict[str, int] = {}
        logical = 0
        for _, m in entries:
            by_kind[m.kind] = by_kind.get(m.kind, 0) + 1
            by_fp[m.fingerprint] = by_fp.get(m.fingerprint, 0) + 1
            logical += m.logical_bytes
        stored = sum(m.stored_bytes for _, m in entries)
        w = self.writer
        return {
            "disk": {"entries": len(entries), "by_kind": by_kind, "stored_bytes": stored,
                     "logical_bytes": logical, "file_bytes": self.disk.file_bytes(),
                     "compression_ratio": round(logical / stored, 3) if stored else None,
                     "budget_bytes": self.disk.budget, "by_fingerprint": by_fp},
            "host": {"entries": len(self.host.items), "bytes": self.host.bytes,
                     "budget_bytes": self.host.budget, "evictions": self.host.evictions},
            "lookups": {"hits": self.counters.hits, "misses": self.counters.misses},
            "corrupt_dropped": self.counters.corrupt,
            "evictions": self.counters.evicted,
            "write_queue": {"depth": w.depth if w else 0, "bytes": w.queued_bytes if w else 0,
                            "dropped": w.dropped if w else 0, "committed": w.committed if w else 0,
                            "failed": w.failed if w else 0},
        }

    def flush(self, timeout: float | None = None) -> bool:
        return True if self.writer is None else self.writer.flush(timeout)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with self.lock:
                touched, self.touched = self.touched, {}
            if touched:
                self.disk.update_meta(touched)
        self.pool.shutdown()
        self.disk.close()

"""The store's admin API (daemon endpoints, inspector): stats, listing, pin, delete,
verify, export/import. Keys are taken and given as hex strings. Held by the
CacheStore (store.py), whose parts, checks (writable, need_model), sync and flush it
works through; store.py imports this module, so the store it is given goes unnamed
here."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ckptd.cache import codec
from ckptd.cache.entry import EntryMeta
from ckptd.cache.keys import key_from_hex
from ckptd.cache.tiers.disk import DiskTier
from ckptd.cache.why.gone import DELETED

_SORTS = {"last_used": lambda m: m.last_used, "size": lambda m: m.stored_bytes or m.logical_bytes,
          "hits": lambda m: m.hits, "created": lambda m: m.created,
          "position": lambda m: m.position}


@dataclass(frozen=True)
class EntryInfo:
    key: str
    kind: str
    position: int
    tokens: list[int]        # a block's tokens, or a snapshot's tail
    parent: str
    stored_bytes: int
    logical_bytes: int
    created: float
    last_used: float
    hits: int
    pinned: bool
    fingerprint: str
    tiers: tuple[str, ...]
    next_position: int | None = None   # a snapshot after images: its next M-RoPE position

    @classmethod
    def of(cls, key: bytes, m: EntryMeta, tiers: tuple[str, ...]) -> EntryInfo:
        return cls(key.hex(), m.kind, m.position, list(m.tokens), m.parent.hex(), m.stored_bytes,
                   m.logical_bytes, m.created, m.last_used, m.hits, m.pinned, m.fingerprint,
                   tiers, m.next_position)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class VerifyReport:
    checked: int
    bad: list[str]           # keys whose value fails its checksum, format or model check
    orphans: list[str]       # keys whose parent block is missing (should never happen)
    dropped: int


class StoreAdmin:
    def __init__(self, store) -> None:
        self.store = store
        self.catalog, self.host, self.disk = store.catalog, store.host, store.disk

    def _merged(self) -> dict[bytes, tuple[EntryMeta, tuple[str, ...]]]:
        self.store.sync()
        with self.catalog.lock:
            out = {k: (m, ("disk",)) for k, m in self.catalog.index.rows.items()}
        for k, m in self.host.scan():
            out[k] = (m, ("host", "disk") if k in out else ("host",))
        return out

    def stats(self) -> dict:
        merged = self._merged()
        disk = {"entries": 0, "by_kind": {}, "stored_bytes": 0, "logical_bytes": 0,
                "pinned_entries": 0, "pinned_bytes": 0, "by_fingerprint": {}}
        for m, tiers in merged.values():
            if "disk" not in tiers:
                continue
            disk["entries"] += 1
            disk["by_kind"][m.kind] = disk["by_kind"].get(m.kind, 0) + 1
            disk["stored_bytes"] += m.stored_bytes
            disk["logical_bytes"] += m.logical_bytes
            if m.pinned:
                disk["pinned_entries"] += 1
                disk["pinned_bytes"] += m.stored_bytes
            fp = disk["by_fingerprint"].setdefault(m.fingerprint, {"entries": 0, "stored_bytes": 0})
            fp["entries"] += 1
            fp["stored_bytes"] += m.stored_bytes
        stored = disk["stored_bytes"]
        disk.update(compression_ratio=round(disk["logical_bytes"] / stored, 3) if stored else None,
                    budget_bytes=self.store.budget, file_bytes=self.disk.file_bytes(),
                    map_bytes=self.disk.map_bytes())
        host_kinds: dict[str, int] = {}
        for m, tiers in merged.values():
            if "host" in tiers:
                host_kinds[m.kind] = host_kinds.get(m.kind, 0) + 1
        w, c, remote = self.store.writer, self.catalog.counters, self.store.remote
        remote = remote.stats() if remote is not None else None
        misses = self.store.why.stats()          # explains what waits: not under the lock
        with self.catalog.lock:
            return {
                "misses": misses,
                "entries": len(merged),
                "disk": disk,
                "host": {"entries": sum(host_kinds.values()), "by_kind": host_kinds,
                         "bytes": self.host.bytes, "budget_bytes": self.host.budget,
                         "evictions": self.host.evictions},
                "lookups": {"count": c.lookups, "hits": c.hits, "misses": c.lookups - c.hits,
                            "hit_tokens": c.hit_tokens},
                "read_bytes": dict(c.read_bytes),
                "corrupt_dropped": c.corrupt,
                "missing": c.missing,
                "evictions": c.evicted,
                "snapshots_thinned": c.thinned,
                "write_queue": {"depth": w.depth if w else 0,
                                "bytes": w.queued_bytes if w else 0,
                                "bound_bytes": self.store.config.queue_bytes,
                                "dropped": w.dropped if w else 0,
                                "shed": dict(w.shed) if w else {},
                                "committed": w.committed if w else 0,
                                "failed": w.failed if w else 0,
                                "lost_no_room": c.lost_writes,
                                "map_full": c.map_full,
                                "orphans_skipped": c.orphans},
                "remote": remote,
            }

    def entries(self, offset: int = 0, limit: int = 100, sort: str = "last_used",
                kind: str | None = None) -> list[EntryInfo]:
        """A page of entries, most recent / biggest / most hit first."""
        if sort not in _SORTS:
            raise ValueError(f"sort must be one of {sorted(_SORTS)}, got {sort!r}")
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must be >= 0")
        rows = [(k, m, t) for k, (m, t) in self._merged().items() if kind in (None, m.kind)]
        rows.sort(key=lambda r: _SORTS[sort](r[1]), reverse=True)
        return [EntryInfo.of(*r) for r in rows[offset:offset + limit]]

    def get_info(self, key_hex: str) -> EntryInfo | None:
        key = key_from_hex(key_hex)
        found = self._merged().get(key)
        return None if found is None else EntryInfo.of(key, *found)

    def delete(self, key_hex: str) -> int:
        """Delete an entry and everything below it (a prefix stays closed)."""
        key = key_from_hex(key_hex)
        self.store.writable()
        self.store.flush()
        children: dict[bytes, list[bytes]] = {}
        for k, m in self.host.scan():
            children.setdefault(m.parent, []).append(k)
        with self.catalog.lock:
            keys = set(self.catalog.index.subtree(key))
            todo = list(keys | {key})
            while todo:
                for c in children.get(todo.pop(), ()):
                    if c not in keys:
                        keys.add(c)
                        todo.append(c)
            metas = [(k, self.catalog.index.remove(k)) for k in keys]
        self.store.gone.left(metas, DELETED, "")
        found = self.disk.delete_many(list(keys))
        in_host = [k for k in keys if self.host.contains(k)]
        for k in in_host:
            self.host.delete(k)
        return len(set(found) | set(in_host))

    def pin(self, key_hex: str) -> int:
        """Pin an entry and its ancestors (a pinned prefix must stay restorable).
        Returns the number of entries pinned, 0 when the key is unknown."""
        return self._set_pinned(key_from_hex(key_hex), True)

    def unpin(self, key_hex: str) -> int:
        """Unpin an entry, and each ancestor that no other pinned entry below needs."""
        return self._set_pinned(key_from_hex(key_hex), False)

    def _set_pinned(self, key: bytes, pinned: bool) -> int:
        # Pins are closed upwards (a pinned entry's ancestors are pinned), so "something
        # below x is pinned" is "a child of x is pinned": no subtree walks.
        self.store.writable()
        self.store.flush()
        changed = {}
        with self.catalog.lock:
            index = self.catalog.index
            if key not in index:
                return 0
            path = [key, *index.ancestors(key)]
            for below, k in zip([None, *path], path):
                m = index.get(k)
                if not pinned and any(index.get(c).pinned
                                      for c in index.children.of(k) if c != below):
                    break                # still needed by another pinned entry below it
                if m.pinned == pinned and k != key:
                    break                # pinning: its ancestors are pinned already
                if m.pinned != pinned:
                    m.pinned = pinned
                    changed[k] = m
        self.disk.update_meta(changed)
        return len(changed)

    def clear(self, include_pinned: bool = False) -> int:
        """Delete every entry (keeping pinned ones unless include_pinned); returns the count.
        Pinned entries have pinned ancestors, so what stays is closed."""
        self.store.writable()
        self.store.flush()
        with self.catalog.lock:
            keys = [k for k, m in self.catalog.index.rows.items() if include_pinned or not m.pinned]
            metas = [(k, self.catalog.index.remove(k)) for k in keys]
        self.store.gone.left(metas, DELETED, "")
        self.disk.delete_many(keys)
        for k, m in self.host.scan():
            if include_pinned or not m.pinned:
                self.host.delete(k)
        return len(keys)

    def evict_to(self, target_bytes: int, hybrid: bool | None = None) -> dict:
        """Evict least-recently-used leaves, never pinned ones, until at most target_bytes
        are stored (what the writer does for its budget, on demand). `hybrid` defaults to
        the spec's; a store opened without a model must say it."""
        self.store.writable()
        if target_bytes < 0:
            raise ValueError(f"target size must be >= 0, got {target_bytes}")
        if hybrid is None:
            self.store.need_model()
        self.store.flush()
        with self.catalog.lock:
            before = self.catalog.index.stored_bytes
        victims = self.store.committer.evict(before - target_bytes, hybrid=hybrid)
        with self.catalog.lock:
            return {"evicted": len(victims), "stored_bytes_before": before,
                    "stored_bytes_after": self.catalog.index.stored_bytes}

    def verify(self, drop: bool = False) -> VerifyReport:
        """Read and check every stored value; with drop=True delete the bad ones (and,
        to keep prefixes closed, everything below them)."""
        if drop:
            self.store.writable()
        merged = {k: m for k, (m, t) in self._merged().items() if "disk" in t}
        keys = list(merged)

        def check(key: bytes, buf: memoryview | None) -> bool:
            try:
                return buf is not None and bool(codec.verify(buf, merged[key].fingerprint,
                                                             key))
            except codec.CorruptValue:
                return False
        bad = []
        for i in range(0, len(keys), 256):
            chunk = keys[i:i + 256]
            ok = self.disk.read_many([(k, merged[k].kind) for k in chunk], check)
            bad += [k for k, good in zip(chunk, ok) if not good]
        orphans = [k for k, m in merged.items() if m.has_block_parent and m.parent not in merged]
        dropped = sum(self.delete(k.hex()) for k in bad + orphans) if drop else 0
        return VerifyReport(len(keys), [k.hex() for k in bad], [k.hex() for k in orphans],
                            dropped)

    def export(self, path: str | Path) -> int:
        """Write a compacted copy of the store to directory `path`; returns its entries."""
        path = Path(path)
        if (path / "data.mdb").exists():
            raise ValueError(f"{path} already holds a store")
        self.store.flush()
        self.disk.copy_to(path)
        with self.catalog.lock:
            return len(self.catalog.index)

    def import_(self, path: str | Path) -> int:
        """Add the entries of an exported store (parents first; values are verified,
        and bad ones are skipped together with what is below them). Returns how many
        were added."""
        self.store.writable()
        src = DiskTier(path, 0, readonly=True)
        try:
            self.store.flush()
            entries = sorted(src.scan(), key=lambda km: km[1].position)
            with self.catalog.lock:
                entries = [(k, m) for k, m in entries if k not in self.catalog.index]
            added = 0
            for i in range(0, len(entries), self.store.config.batch):
                chunk = entries[i:i + self.store.config.batch]
                blobs = src.read_many([(k, m.kind) for k, m in chunk],
                                      lambda k, buf: None if buf is None else bytes(buf))
                batch = []
                for (k, m), blob in zip(chunk, blobs):
                    try:
                        codec.verify(blob or b"", m.fingerprint, k)
                    except codec.CorruptValue:
                        continue
                    batch.append((k, m, blob))
                self.store.committer.commit(batch)
                with self.catalog.lock:
                    added += sum(1 for k, _, _ in batch if k in self.catalog.index)
            return added
        finally:
            src.close()

"""What a view of the store (the daemon's page) reads: every entry with the tiers that
hold it, for the prefix tree (cache/tree.py), and the pinned prefixes. Entries are
copied under the catalog's lock, then shaped outside it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckptd.cache.store.store import CacheStore


def tier_entries(store: CacheStore,
                 on_device: Callable[[list[bytes]], list[bool]] | None = None) -> list[dict]:
    """Every entry (RAM and disk) as a dict of the fields cache/tree.py reads, with
    `tiers`: device (its page is in the prefix table, per on_device), host, disk."""
    with store.catalog.lock:
        rows = list(store.catalog.index.rows.items())
    merged = {k: (m, ["disk"]) for k, m in rows}
    for k, m in store.host.scan():
        if k in merged:
            merged[k][1].insert(0, "host")
        else:
            merged[k] = (m, ["host"])
    keys = list(merged)
    device = on_device(keys) if on_device is not None else [False] * len(keys)
    return [{"key": k.hex(), "parent": m.parent.hex(), "kind": m.kind, "position": m.position,
             "tokens": m.tokens, "stored_bytes": m.stored_bytes,
             "logical_bytes": m.logical_bytes, "pinned": m.pinned, "hits": m.hits,
             "last_used": m.last_used, "fingerprint": m.fingerprint,
             "tiers": ["device", *tiers] if dev else tiers}
            for (k, (m, tiers)), dev in zip(merged.items(), device)]


def pinned_prefixes(store: CacheStore, tail: int = 32) -> list[dict]:
    """The pinned prefixes, longest first: each pinned entry below which nothing is
    pinned (pins are closed upwards), with its whole prefix's entries and stored bytes
    and its last `tail` tokens."""
    with store.catalog.lock:
        rows = dict(store.catalog.index.rows)
    pinned = {k for k, m in rows.items() if m.pinned}
    inner = {rows[k].parent for k in pinned}
    out = []
    for tip in pinned - inner:
        m = rows[tip]
        tokens, entries, nbytes, k = list(m.tokens), 1, m.stored_bytes, m.parent
        while k in rows:
            p = rows[k]
            entries, nbytes, k = entries + 1, nbytes + p.stored_bytes, p.parent
            if len(tokens) < tail:
                tokens = p.tokens + tokens
        out.append({"key": tip.hex(), "kind": m.kind, "position": m.position,
                    "entries": entries, "stored_bytes": nbytes, "hits": m.hits,
                    "last_used": m.last_used, "fingerprint": m.fingerprint,
                    "last_tokens": tokens[-tail:]})
    return sorted(out, key=lambda e: -e["position"])

"""The in-memory copy of the disk index, kept by the one process that writes.

LMDB's meta database is the persistent index; this mirror, loaded once at open,
lets lookups and eviction run without a transaction or JSON per entry. It is
plain data: the store holds its lock around every call.
"""

from __future__ import annotations

from collections.abc import Iterable

from ckptd.cache.children import Children
from ckptd.cache.entry import SNAPSHOT, EntryMeta


class DiskIndex:
    def __init__(self, entries: Iterable[tuple[bytes, EntryMeta]] = ()) -> None:
        self.rows: dict[bytes, EntryMeta] = {}
        self.children = Children()                      # parent key -> child keys
        self.roots: dict[bytes, int] = {}               # root key -> entries hanging from it
        self.stored_bytes = 0
        self.logical_bytes = 0
        for key, meta in entries:
            self.add(key, meta)

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, key: bytes) -> bool:
        return key in self.rows

    def get(self, key: bytes) -> EntryMeta | None:
        return self.rows.get(key)

    def add(self, key: bytes, meta: EntryMeta) -> None:
        self.remove(key)
        self.rows[key] = meta
        self.children.add(key, meta.parent, meta.kind == SNAPSHOT)
        if not meta.has_block_parent:
            self.roots[meta.parent] = self.roots.get(meta.parent, 0) + 1
        self.stored_bytes += meta.stored_bytes
        self.logical_bytes += meta.logical_bytes

    def remove(self, key: bytes) -> EntryMeta | None:
        meta = self.rows.pop(key, None)
        if meta is None:
            return None
        self.children.remove(key, meta.parent, meta.kind == SNAPSHOT)
        if not meta.has_block_parent:
            self.roots[meta.parent] -= 1
            if not self.roots[meta.parent]:
                del self.roots[meta.parent]
        self.stored_bytes -= meta.stored_bytes
        self.logical_bytes -= meta.logical_bytes
        return meta

    def children_after(self, parent: bytes) -> list[tuple[bytes, EntryMeta]]:
        return [(k, self.rows[k]) for k in self.children.of(parent)]

    def subtree(self, key: bytes) -> list[bytes]:
        """`key` and everything below it, parents before children."""
        out, todo = [], [key]
        while todo:
            k = todo.pop()
            out.append(k)
            todo.extend(self.children.of(k))
        return out

    def ancestors(self, key: bytes) -> list[bytes]:
        """The stored entries above `key`, nearest first."""
        out = []
        meta = self.rows.get(key)
        while meta is not None and meta.parent in self.rows:
            out.append(meta.parent)
            meta = self.rows[meta.parent]
        return out

    def prune_orphans(self) -> list[bytes]:
        """Take out every entry whose parent block is missing, and what is below it (a
        damaged record was left out when the file was read): the index is closed
        again. Returns the keys taken out."""
        gone: list[bytes] = []
        for key in [k for k, m in self.rows.items()
                    if m.has_block_parent and m.parent not in self.rows]:
            if key in self.rows:
                for k in self.subtree(key):
                    if self.remove(k) is not None:
                        gone.append(k)
        return gone

    def sanity_check(self) -> None:
        """The index is closed (every entry's parent block is present), pins are closed
        upwards, and the derived maps and byte counts match the rows. AssertionError
        names what broke."""
        self.children.check(((k, m.parent, m.kind == SNAPSHOT) for k, m in self.rows.items()),
                            "the index")
        roots: dict[bytes, int] = {}
        for key, m in self.rows.items():
            if not m.has_block_parent:
                roots[m.parent] = roots.get(m.parent, 0) + 1
                continue
            parent = self.rows.get(m.parent)
            assert parent is not None, f"entry {key.hex()} has lost its parent block"
            assert not m.pinned or parent.pinned, f"pinned {key.hex()} has an unpinned parent"
        assert roots == self.roots, "the index's root counts are off"
        assert self.stored_bytes == sum(m.stored_bytes for m in self.rows.values())
        assert self.logical_bytes == sum(m.logical_bytes for m in self.rows.values())

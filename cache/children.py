"""Parent -> children bookkeeping, written once: which entries name each key as their
parent, and how many of those are snapshots. The host tier, the disk index and the
device's prefix table each keep one beside their entries, for what a closed prefix
needs: a key's children (a lookup finds the snapshots after a block), whether it has
any (only leaves are evicted), and a check that it matches the entries."""

from __future__ import annotations

from collections.abc import Iterable


class Children:
    def __init__(self) -> None:
        self._of: dict[bytes, set[bytes]] = {}        # parent key -> keys naming it
        self._snapshots: dict[bytes, int] = {}        # parent key -> snapshots among them

    def add(self, key: bytes, parent: bytes | None, snapshot: bool = False) -> None:
        """key names parent (None: no parent to count, a first block on the device)."""
        if parent is None:
            return
        self._of.setdefault(parent, set()).add(key)
        if snapshot:
            self._snapshots[parent] = self._snapshots.get(parent, 0) + 1

    def remove(self, key: bytes, parent: bytes | None, snapshot: bool = False) -> None:
        """key, added with this parent, is gone."""
        sibs = self._of.get(parent)
        if sibs is not None:
            sibs.discard(key)
            if not sibs:
                del self._of[parent]
        if snapshot:
            self._snapshots[parent] -= 1
            if not self._snapshots[parent]:
                del self._snapshots[parent]

    def of(self, parent: bytes) -> set[bytes] | tuple[()]:
        """The keys naming parent (do not change it)."""
        return self._of.get(parent, ())

    def counts(self) -> dict[bytes, int]:
        """How many keys name each parent that has any."""
        return {p: len(c) for p, c in self._of.items()}

    def has_snapshots(self, parent: bytes) -> bool:
        return parent in self._snapshots

    def with_snapshots(self, parents) -> set[bytes]:
        """Those of parents that have snapshots after them (one pass: a long prompt asks
        about every block)."""
        snaps = self._snapshots
        return {p for p in parents if p in snaps}

    def clear(self) -> None:
        self._of.clear()
        self._snapshots.clear()

    def check(self, entries: Iterable[tuple[bytes, bytes | None, bool]], what: str) -> None:
        """AssertionError unless this is the bookkeeping of exactly these (key, parent,
        is a snapshot) entries."""
        want = Children()
        for key, parent, snapshot in entries:
            want.add(key, parent, snapshot)
        assert want._of == self._of, f"{what}: the child sets are off"
        assert want._snapshots == self._snapshots, f"{what}: the snapshot counts are off"

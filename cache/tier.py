"""The one interface every tier offers (DESIGN.md: get, put, contains, delete, scan):
RAM (tiers/host.py), LMDB (tiers/disk.py) and the shared remote store (remote/tier.py).
Values are a tier's own representation: tensors in RAM, encoded bytes on disk and in
the remote. Metadata (EntryMeta) travels with every value. tests/cache/test_tiers.py
holds each tier to it: its methods, parameters in this order (more only with
defaults)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from ckptd.cache.entry import EntryMeta

V = TypeVar("V")


class Tier(Protocol[V]):
    name: str

    def get(self, key: bytes) -> V | None: ...

    def get_many(self, keys: Sequence[bytes]) -> list[V | None]: ...

    def put(self, key: bytes, meta: EntryMeta, value: V) -> bool:
        """Store one value; False when the tier declined it (too big, parent missing)."""
        ...

    def put_many(self, items: Sequence[tuple[bytes, EntryMeta, V]]) -> list[bytes]:
        """Store many values at once (one transaction where the tier has them);
        returns the keys actually stored."""
        ...

    def meta(self, key: bytes) -> EntryMeta | None: ...

    def contains(self, key: bytes) -> bool: ...

    def delete(self, key: bytes) -> None: ...

    def scan(self) -> list[tuple[bytes, EntryMeta]]: ...

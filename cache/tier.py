"""The one interface the tiers of entries offer (DESIGN.md: get, put, contains, delete,
scan): RAM (tiers/host.py) and LMDB (tiers/disk.py). Values are a tier's own
representation: tensors in RAM, encoded bytes on disk. Metadata (EntryMeta) travels
with every value. tests/cache/test_tiers.py holds each tier to it: its methods,
parameters in this order (more only with defaults).

The shared remote store (remote/tier.py) keeps no entry under its own key: blocks live
in segments cut at fixed positions and a snapshot in a state object that indexes them
(issue 32), written only by its uploader from LMDB and read by restore plans, so it
offers plan/offer/flush/states instead of this interface."""

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

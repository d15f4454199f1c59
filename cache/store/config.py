"""The store's budgets, queue and thread counts (CacheStore's one configuration)."""

from __future__ import annotations

from dataclasses import dataclass


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

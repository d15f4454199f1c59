"""The RAM tier: uncompressed tensors, LRU within a byte budget.

On a CPU-only machine this is the only in-memory tier (device memory is RAM).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from cache.entry import EntryMeta


def tensors_nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class HostTier:
    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.items: OrderedDict[bytes, tuple[EntryMeta, dict[str, torch.Tensor]]] = OrderedDict()
        self.bytes = 0
        self.evictions = 0
        self.lock = threading.Lock()

    def put(self, key: bytes, meta: EntryMeta, tensors: dict[str, torch.Tensor]) -> None:
        size = tensors_nbytes(tensors)
        if size > self.budget:
            return
        with self.lock:
            old = self.items.pop(key, None)
            if old is not None:
                self.bytes -= tensors_nbytes(old[1])
            self.items[key] = (meta, tensors)
            self.bytes += size
            while self.bytes > self.budget:
                _, (_, t) = self.items.popitem(last=False)
                self.bytes -= tensors_nbytes(t)
                self.evictions += 1

    def get(self, key: bytes) -> tuple[EntryMeta, dict[str, torch.Tensor]] | None:
        with self.lock:
            item = self.items.get(key)
            if item is not None:
                self.items.move_to_end(key)
            return item

    def meta(self, key: bytes) -> EntryMeta | None:
        with self.lock:
            item = self.items.get(key)
            return None if item is None else item[0]

    def contains(self, key: bytes) -> bool:
        with self.lock:
            return key in self.items

    def delete(self, key: bytes) -> None:
        with self.lock:
            item = self.items.pop(key, None)
            if item is not None:
                self.bytes -= tensors_nbytes(item[1])

    def scan(self) -> list[tuple[bytes, EntryMeta]]:
        with self.lock:
            return [(k, m) for k, (m, _) in self.items.items()]

    def clear(self) -> None:
        with self.lock:
            self.items.clear()
            self.bytes = 0

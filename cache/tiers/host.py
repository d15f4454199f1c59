"""The RAM tier: uncompressed tensors, LRU within a byte budget.

On a CPU-only machine this is the only in-memory tier (device memory is RAM).
Values are shared, never copied here: callers clone what they hand in and must
not write to what they get back.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from ckptd.cache.children import Children
from ckptd.cache.entry import SNAPSHOT, EntryMeta

Tensors = dict[str, torch.Tensor]


def owned_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy a value owns alone; pinned stays pinned (on a GPU, a restore's copy up to
    the device is then asynchronous: model/transfers.py)."""
    if not t.is_pinned():
        return t.detach().clone()
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)


# put_blocks copies a checkpoint's pages this many bytes at a time (cache/store/store.py)
GROUP_BYTES = 16 << 20


def owned_rows(t: torch.Tensor, rows: list[int],
               group_bytes: int = GROUP_BYTES) -> list[torch.Tensor]:
    """Copies of t[i] for i in rows, made for runs of consecutive rows at once, at most
    group_bytes a copy: one allocation for many rows, not one each (a 250K-token
    context is ~15,600 blocks; allocating each page apart cost ~7 ms a page here in page
    faults, and on a GPU each pinned allocation is a cudaHostAlloc). Each row is a view
    of its run's copy, so a copy's memory is freed when the last of its rows is dropped:
    rows stored together are evicted together (LRU), so at most a run's worth stays."""
    per = max(1, group_bytes // max(1, t[0].numel() * t.element_size())) if len(t) else 1
    out: list[torch.Tensor] = []
    i = 0
    while i < len(rows):
        j = i + 1
        while j < len(rows) and j - i < per and rows[j] == rows[j - 1] + 1:
            j += 1
        out.extend(owned_copy(t[rows[i]:rows[j - 1] + 1]).unbind(0))
        i = j
    return out


def tensors_nbytes(tensors: Tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class HostTier:
    name = "host"

    def __init__(self, budget_bytes: int,
                 on_evict: Callable[[list[tuple[bytes, EntryMeta]]], None] | None = None) -> None:
        """on_evict(items): called, under no lock of the tier's, with what a put evicted."""
        if budget_bytes < 0:
            raise ValueError(f"host budget must be >= 0, got {budget_bytes}")
        self.budget = budget_bytes
        self.items: OrderedDict[bytes, tuple[EntryMeta, Tensors, int]] = OrderedDict()
        self.children = Children()                   # parent key -> keys of entries after it
        self.bytes = 0
        self.evictions = 0
        self.on_evict = on_evict
        self.lock = threading.Lock()

    def accepts(self, nbytes: int) -> bool:
        return 0 < nbytes <= self.budget

    def put(self, key: bytes, meta: EntryMeta, value: Tensors) -> bool:
        size = tensors_nbytes(value)
        if size > self.budget:
            return False
        evicted = []
        with self.lock:
            self._pop(key)
            self.items[key] = (meta, value, size)
            self.bytes += size
            self.children.add(key, meta.parent, meta.kind == SNAPSHOT)
            while self.bytes > self.budget:
                old = next(iter(self.items))
                evicted.append((old, self.items[old][0]))
                self._pop(old)
                self.evictions += 1
        if evicted and self.on_evict is not None:
            self.on_evict(evicted)
        return True

    def put_many(self, items: Sequence[tuple[bytes, EntryMeta, Tensors]]) -> list[bytes]:
        return [k for k, m, v in items if self.put(k, m, v)]

    def _pop(self, key: bytes) -> None:
        item = self.items.pop(key, None)
        if item is None:
            return
        meta, _, size = item
        self.bytes -= size
        self.children.remove(key, meta.parent, meta.kind == SNAPSHOT)

    def get(self, key: bytes) -> Tensors | None:
        with self.lock:
            item = self.items.get(key)
            if item is None:
                return None
            self.items.move_to_end(key)
            return item[1]

    def get_many(self, keys: Sequence[bytes]) -> list[Tensors | None]:
        """get for each key, under one hold of the lock (a restore asks for ~2,000)."""
        out: list[Tensors | None] = []
        with self.lock:
            items = self.items
            if not items:
                return [None] * len(keys)
            for k in keys:
                item = items.get(k)
                if item is not None:
                    items.move_to_end(k)
                out.append(None if item is None else item[1])
        return out

    def meta(self, key: bytes) -> EntryMeta | None:
        with self.lock:
            item = self.items.get(key)
            return None if item is None else item[0]

    def metas(self, keys: Sequence[bytes]) -> list[EntryMeta | None]:
        with self.lock:
            if not self.items:
                return [None] * len(keys)
            return [None if (item := self.items.get(k)) is None else item[0] for k in keys]

    def has_snapshots(self, parent: bytes) -> bool:
        with self.lock:
            return self.children.has_snapshots(parent)

    def with_snapshots(self, parents: Sequence[bytes]) -> set[bytes]:
        with self.lock:
            return self.children.with_snapshots(parents)

    def children_after(self, parent: bytes) -> list[tuple[bytes, EntryMeta]]:
        with self.lock:
            return [(k, self.items[k][0]) for k in self.children.of(parent)]

    def contains(self, key: bytes) -> bool:
        with self.lock:
            return key in self.items

    def delete(self, key: bytes) -> None:
        with self.lock:
            self._pop(key)

    def scan(self) -> list[tuple[bytes, EntryMeta]]:
        with self.lock:
            return [(k, m) for k, (m, _, _) in self.items.items()]

    def clear(self) -> None:
        with self.lock:
            self.items.clear()
            self.children.clear()
            self.bytes = 0

    def sanity_check(self) -> None:
        """Bytes held match the values, within the budget; the maps match the items."""
        with self.lock:
            assert self.bytes == sum(size for _, _, size in self.items.values()), \
                "host tier bytes are off"
            assert self.bytes <= self.budget, "host tier is over its budget"
            for _, value, size in self.items.values():
                assert size == tensors_nbytes(value)
            self.children.check(((k, m.parent, m.kind == SNAPSHOT)
                                 for k, (m, _, _) in self.items.items()), "host tier")

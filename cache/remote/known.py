"""Segments known to be on the remote: what an upload names instead of putting again.

Fed by the uploads (a segment put, or found there) and by restores (the segments a
state's head names), by the keys of their blocks: a block key names its whole prefix,
so the segment holding a chain's block at key K holds every block of that chain from
its start to K. What is known may have gone since (gc, or deleted as corrupt by a
daemon that read it): an upload asks for a known segment (HEAD) before a state names
it (publish.py), and forgets it when it is gone. The oldest entries go beyond
max_blocks (~150 bytes a block).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from itertools import repeat

from ckptd.cache.remote.state import SegmentRef


class Known:
    def __init__(self, max_blocks: int = 1 << 20) -> None:
        self.max_blocks = max_blocks
        self.lock = threading.Lock()
        self.refs: OrderedDict[str, tuple[SegmentRef, list[bytes]]] = OrderedDict()
        self.by_key: dict[bytes, tuple[str, int]] = {}
        self.blocks = 0

    def add(self, ref: SegmentRef, keys: list[bytes]) -> None:
        """keys: the chain keys of ref's used blocks."""
        with self.lock:
            old = self.refs.get(ref.name)
            if old is not None and old[0].used >= ref.used:
                self.refs.move_to_end(ref.name)   # known as far (every restore names it)
                return
            self.refs.pop(ref.name, None)
            self._drop(old)
            self.refs[ref.name] = (ref, keys)
            name = ref.name
            self.by_key.update(zip(keys, zip(repeat(name), range(len(keys)))))
            self.blocks += len(keys)
            while self.blocks > self.max_blocks and len(self.refs) > 1:
                self._drop(self.refs.popitem(last=False)[1])

    def _drop(self, item) -> None:
        if item is None:
            return
        ref, keys = item
        for k in keys:
            if self.by_key.get(k, (None,))[0] == ref.name:
                del self.by_key[k]
        self.blocks -= len(keys)

    def at(self, key: bytes) -> tuple[SegmentRef, int] | None:
        """The segment holding the block of this key, and its index there."""
        with self.lock:
            hit = self.by_key.get(key)
            if hit is None:
                return None
            self.refs.move_to_end(hit[0])
            return self.refs[hit[0]][0], hit[1]

    def forget(self, name: str) -> None:
        with self.lock:
            self._drop(self.refs.pop(name, None))

"""The disk side of the write-behind queue: encode on the pool, make room within the
budget, commit a batch in one LMDB transaction, keep the in-memory index in step.

Runs on the writer's threads (cache/store/writer.py). Eviction happens before a
commit, so the stored bytes never pass the budget. What a commit wrote is then
handed to `on_commit` (the remote tier's uploader), except what came from the
remote in the first place (Fetched: already encoded, already there).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from ckptd.cache import codec
from ckptd.cache.entry import EntryMeta
from ckptd.cache.store.catalog import Catalog
from ckptd.cache.store.evict import pick_victims
from ckptd.cache.store.thin import Forget, split_forgets
from ckptd.cache.tiers.disk import DiskFull, DiskTier
from ckptd.cache.why.gone import BUDGET, EVICTED, Gone

log = logging.getLogger(__name__)
Encoded = tuple[bytes, EntryMeta, bytes]


class Fetched(NamedTuple):
    """A queue item read from the remote tier: its LMDB value as the remote had it."""
    key: bytes
    meta: EntryMeta
    blob: bytes | memoryview      # a view of the fetch's buffer (never written again)


class Committer:
    def __init__(self, catalog: Catalog, disk: DiskTier, fingerprint: str | None,
                 budget: int, hybrid: bool | None,
                 on_commit: Callable[[list[Encoded]], object] | None = None,
                 gone: Gone | None = None) -> None:
        """hybrid: the model's (None for a store opened without one: evict says).
        on_commit: called on the writer thread with the entries each commit wrote.
        gone: where evictions and writes refused are recorded."""
        self.catalog, self.disk, self.fp = catalog, disk, fingerprint
        self.budget, self.hybrid = budget, hybrid
        self.on_commit = on_commit
        self.gone = gone if gone is not None else Gone()

    def encode(self, item) -> Encoded | Forget | Fetched:
        if isinstance(item, (Forget, Fetched)):
            return item
        key, meta, tensors = item
        blob = codec.encode(tensors, self.fp, key=key)
        meta.stored_bytes = len(blob)
        return key, meta, blob

    def commit(self, batch: list[Encoded | Forget]) -> int:
        """Delete what the batch forgets, then write its puts; returns how many entries
        were lost for want of room."""
        queued_keys = [item[0] for item in batch if not isinstance(item, Forget)]
        batch, forget = split_forgets(batch)
        touched = self.catalog.take_touched()
        with self.catalog.lock:
            # Parents of anything queued stay: evicting one would orphan its child.
            protect = {m.parent for _, m, _ in batch} | set(self.catalog.queued.values())
        keep: list[Encoded] = []
        written: list[bytes] = []
        orphans = 0
        try:
            if forget:
                self.forget_now(forget)
            keep, orphans = self._make_room(batch, protect)
            written = self._write(keep, touched, protect)
            if written is None:
                keep, written = [], []
        finally:
            metas = {k: m for k, m, _ in batch}
            cat = self.catalog
            with cat.lock:
                for k in written:
                    # a key forgotten while its put waited in the queue stays out of the
                    # index: the queued delete takes it off the disk next
                    if k not in cat.forgetting:
                        cat.index.add(k, metas[k])
                for k in queued_keys:
                    cat.queued.pop(k, None)
                lost = len(batch) - len(keep) - orphans
                cat.counters.lost_writes += lost
                cat.counters.orphans += orphans
            if len(written) < len(batch):
                done = set(written)
                self.gone.left([(k, m) for k, m in metas.items() if k not in done], BUDGET,
                               "disk", "the disk budget had no room for it (pinned entries, "
                               "or a batch larger than the budget)")
        if written and self.on_commit is not None:
            done = set(written)
            try:
                self.on_commit([item for item in keep
                                if item[0] in done and not isinstance(item, Fetched)])
            except Exception:       # the batch is on disk: an upload's trouble stays there
                log.exception("cache: could not queue committed entries for upload")
        return lost

    def _write(self, items: list[Encoded], touched: dict, protect: set[bytes]):
        """The keys written, or None when the map stayed full."""
        try:
            return self.disk.put_many(items, touched)
        except DiskFull:
            with self.catalog.lock:
                self.catalog.counters.map_full += 1
        # Fragmentation, or a map too small for its budget: free a margin, let LMDB
        # release the freed pages (it reuses them two transactions later), retry once.
        # 5% of what is stored, not of the budget: a filesystem that fills up long before
        # the budget must not cost the whole cache.
        with self.catalog.lock:
            stored = self.catalog.index.stored_bytes
        margin = 2 * sum(len(b) for _, _, b in items) + min(self.budget, stored) // 20
        try:
            self.evict(margin, protect)         # a full disk may refuse even the deletes
            self.disk.commit_empty()
            return self.disk.put_many(items, touched)
        except DiskFull:
            return None

    def _make_room(self, batch: list[Encoded], protect: set[bytes]) -> tuple[list[Encoded], int]:
        """Evict so that the batch fits the budget. Returns the items to write, and how
        many were left out as orphans. When the batch still doesn't fit (a batch larger
        than the budget, or the rest pinned), its newest chains are kept whole and the
        next newer one as far as it fits from its start (a chain: items each the child
        of the one before); an item whose parent is then missing goes too."""
        cat = self.catalog
        with cat.lock:
            # Children of a parent that is gone can't be written (prefixes stay closed):
            # don't evict anything to make room for them.
            kept = _with_parents(batch, cat.index)
            orphans, batch = len(batch) - len(kept), kept
            incoming = sum(len(b) for _, _, b in batch)
            over = cat.index.stored_bytes + incoming - self.budget
        if over > 0:
            self.evict(over, protect)
        with cat.lock:
            room = self.budget - cat.index.stored_bytes
        if incoming <= room:
            return batch, orphans
        chains: list[list[Encoded]] = []
        for item in batch:
            meta = item[1]
            if chains and meta.has_block_parent and meta.parent == chains[-1][-1][0]:
                chains[-1].append(item)
            else:
                chains.append([item])
        chosen: list[list[Encoded]] = []
        for chain in reversed(chains):
            size = sum(len(item[2]) for item in chain)
            if size > room:
                part = []
                for item in chain:
                    if len(item[2]) > room:
                        break
                    part.append(item)
                    room -= len(item[2])
                chosen.append(part)
                break
            chosen.append(chain)
            room -= size
        with cat.lock:
            return _with_parents([item for chain in reversed(chosen) for item in chain],
                                 cat.index), orphans

    def evict(self, need: int, protect: set[bytes] | frozenset[bytes] = frozenset(),
              hybrid: bool | None = None) -> list[bytes]:
        """Delete LRU leaves worth `need` bytes; returns their keys. `hybrid` (default:
        the model's) is for a store opened without a model, like the inspector's."""
        hybrid = self.hybrid if hybrid is None else hybrid
        if hybrid is None:
            raise ValueError("this store was opened without a model: say whether it is hybrid")
        cat = self.catalog
        with cat.lock:
            victims = pick_victims(cat.index, need, hybrid, protect)
            metas = [(k, cat.index.remove(k)) for k in victims]
            cat.counters.evicted += len(victims)
        self.gone.left(metas, EVICTED, "disk", "least recently used, over the disk budget")
        if victims:
            self.disk.delete_many(victims)      # the index no longer plans them
        return victims

    def forget_now(self, keys: set[bytes]) -> None:
        """The disk side of a thinning (Thinner.forget), in queue order. Entries
        committed since the forget are in the index again: take them out too."""
        cat = self.catalog
        with cat.lock:
            for k in keys:
                cat.index.remove(k)
        try:
            self.disk.delete_many(sorted(keys))
        except DiskFull:       # out of the index; after a restart a later put thins them again
            log.warning("cache: could not delete %d thinned snapshots: map full", len(keys))
        finally:
            with cat.lock:
                cat.forgetting.difference_update(keys)


def _with_parents(items: list[Encoded], index) -> list[Encoded]:
    """The items (parents first) whose block parent is written or earlier among those
    kept: a prefix stays closed."""
    kept: set[bytes] = set()
    out = []
    for item in items:
        key, meta, _ = item
        if not meta.has_block_parent or meta.parent in kept or meta.parent in index:
            out.append(item)
            kept.add(key)
    return out

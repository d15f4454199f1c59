"""Bounding the snapshots along one prefix: dense near its end, sparse far from it.

A prefill leaves a snapshot every snapshot_interval tokens, so a long prefix
collects many (a 256K-token context at 1024: 256 recurrent states). A later
prompt restores from the deepest one at or below where it leaves the prefix and
recomputes the rest; prompts mostly leave a prefix near its end (the next chat
turn, a question after a context), and a miss far back costs little more when
the gap is small relative to the distance. So when a snapshot is stored, the
older ones on its path are dropped one at a time, always the one whose removal
opens the smallest gap relative to its distance from the new end, until at most
`keep` remain: survivors end up spaced about geometrically back from the end
(1, 2, 4, ... intervals). A snapshot that restores have used (a branch point: the
end of a document that questions leave from) counts as that many times harder to
drop. Pinned snapshots are never dropped.

Snapshots are leaves (no entry names one as its parent), so dropping them keeps
every prefix closed; blocks stay.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from ckptd.cache.entry import SNAPSHOT, EntryMeta
from ckptd.cache.keys import KeyContext, snapshot_key
from ckptd.cache.store.catalog import Catalog
from ckptd.cache.tiers.host import HostTier
from ckptd.cache.why.gone import THINNED, Gone


@dataclass(frozen=True)
class Forget:
    """A write-behind queue item: delete these snapshots from disk, in order with the
    puts queued before it."""
    keys: tuple[bytes, ...]


def thin_victims(positions: Sequence[int], end: int, keep: int,
                 pinned: Collection[int] = (), hits: Mapping[int, int] | None = None,
                 firm: Collection[int] = ()) -> list[int]:
    """Which of `positions` (snapshot positions on one path, all below `end`) to drop
    so that at most `keep` remain together with the one at `end`. Fewer are dropped
    when only pinned ones are left. hits: restores served per position. firm: end and
    branch snapshots, dropped only once no interval one is left to drop."""
    hits = hits or {}
    kept = sorted({p for p in positions if p < end} | {end})
    victims: list[int] = []
    while len(kept) > keep:
        best: tuple[bool, float, int] | None = None
        for i, p in enumerate(kept[:-1]):
            if p in pinned:
                continue
            gap = kept[i + 1] - (kept[i - 1] if i else 0)
            score = (p in firm, gap / (end - p) * (1 + hits.get(p, 0)), i)
            if best is None or score < best:
                best = score
        if best is None:
            break
        victims.append(kept.pop(best[2]))
    return victims


class Thinner:
    def __init__(self, catalog: Catalog, host: HostTier, block_size: int,
                 queue_forget: Callable[[Forget], None], gone: Gone | None = None) -> None:
        """queue_forget: puts a Forget into the write-behind queue, in order with puts;
        gone: where the snapshots dropped are recorded."""
        self.catalog, self.host, self.B = catalog, host, block_size
        self.queue_forget = queue_forget
        self.gone = gone if gone is not None else Gone()

    def thin(self, tokens: list[int], parents: list[bytes], keep: int,
              ctx: KeyContext) -> int:
        """Drop snapshots on the path of tokens (parents[d]: the key before block d)
        until at most `keep` remain with the one at len(tokens). Returns how many."""
        B, end = self.B, len(tokens)
        depth = {p: d for d, p in enumerate(parents)}
        found: dict[int, tuple[bytes, EntryMeta]] = {}
        for parent in self.catalog.with_snapshots(parents):
            d = depth[parent]
            for key, meta, _ in self.catalog.children_after(parent):
                pos = d * B + len(meta.tokens)
                if meta.kind != SNAPSHOT or not 0 < pos < end:
                    continue
                tail = tokens[d * B:pos]
                if meta.tokens == tail and snapshot_key(parent, tail, d, B, ctx) == key:
                    found[pos] = (key, meta)
        if len(found) < keep:
            return 0
        pinned = {p for p, (_, m) in found.items() if m.pinned}
        hits = {p: m.hits for p, (_, m) in found.items()}
        firm = {p for p, (_, m) in found.items() if m.keep_first}
        victims = thin_victims(list(found), end, keep, pinned, hits, firm)
        return self.forget([found[p][0] for p in victims])

    def forget(self, keys: Sequence[bytes]) -> int:
        """Drop snapshots from every tier: RAM and the index now (no plan sees them),
        disk through the write-behind queue (the decode loop never waits on disk)."""
        keys = tuple(keys)
        if not keys:
            return 0
        cat = self.catalog
        metas = self.host.metas(keys)
        with cat.lock:
            metas = [(k, cat.index.remove(k) or m) for k, m in zip(keys, metas)]
            cat.forgetting.update(keys)
            cat.counters.thinned += len(keys)
        self.gone.left(metas, THINNED, "")
        for k in keys:
            self.host.delete(k)
        self.queue_forget(Forget(keys))
        return len(keys)


def split_forgets(batch: list) -> tuple[list, set[bytes]]:
    """(the puts of a writer batch, the keys to delete first). A put followed by a
    Forget of its key is not written; one that follows the Forget is."""
    puts: list = []
    forget: set[bytes] = set()
    for item in batch:
        if isinstance(item, Forget):
            gone = set(item.keys)
            forget |= gone
            puts = [p for p in puts if p[0] not in gone]
        else:
            puts.append(item)
    return puts, forget

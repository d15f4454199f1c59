"""What the remote holds of one prompt beyond the local tiers, found with few requests.

Blocks: the prompt's block keys are known, so the remote is asked whether block
D-1 exists for a few depths D at once (HEAD requests in parallel), and the
search narrows to the deepest present block like a binary search with `fanout`
probes a round: log_{fanout+1}(blocks) rounds of one round trip each (a 32K-token
prompt at block 16: 4 rounds). It assumes what the remote holds of a chain is a
prefix (uploads go in commit order, parents first); where it is not (an upload
failed, gc took a parent), the load finds the gap and the restore falls back to
the good part below it.

Snapshots: one LIST of `after/{parent}/` per depth, from the deepest block down
(in parallel batches), until one names a snapshot whose key the prompt's own tail
tokens hash to: the key check is the token check, since a key names its tokens.

Everything found is a claim, not a fact: the load verifies each object (frame
checksum, value checksum, key, and the meta against the prompt), and anything
that fails is treated as missing or corrupt, never served.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import wait
from dataclasses import dataclass, field

from ckptd.cache.entry import BLOCK, SNAPSHOT, EntryMeta
from ckptd.cache.keys import KeyChain, snapshot_key
from ckptd.cache.lookup import REMOTE
from ckptd.cache.remote.client import RemoteClient, RemoteError
from ckptd.cache.remote.layout import Layout


@dataclass
class Found:
    """The remote's entries for one prompt, as planning reads them (cache/lookup.py)."""
    blocks: dict[bytes, EntryMeta] = field(default_factory=dict)
    snaps: dict[bytes, list[tuple[bytes, EntryMeta]]] = field(default_factory=dict)
    requests: int = 0
    seconds: float = 0.0
    failed: bool = False          # a request failed: what was found may be partial
    deadline: float = 0.0         # perf_counter time the search gives up

    @property
    def metas(self) -> dict[bytes, EntryMeta]:
        out = dict(self.blocks)
        for found in self.snaps.values():
            out.update(found)
        return out


class LayeredView:
    """The local tiers first (the store's Catalog), then what the remote holds."""

    def __init__(self, local, found: Found) -> None:
        self.local, self.found = local, found

    def find_many(self, keys: Sequence[bytes]) -> list[tuple[EntryMeta, str] | None]:
        out = self.local.find_many(keys)
        blocks = self.found.blocks
        return [hit if hit is not None or k not in blocks else (blocks[k], REMOTE)
                for k, hit in zip(keys, out)]

    def has_snapshots(self, parent: bytes) -> bool:
        return parent in self.found.snaps or self.local.has_snapshots(parent)

    def children_after(self, parent: bytes) -> list[tuple[bytes, EntryMeta, str]]:
        out = self.local.children_after(parent)
        have = {k for k, _, _ in out}
        return out + [(k, m, REMOTE) for k, m in self.found.snaps.get(parent, ())
                      if k not in have]


class Finder:
    def __init__(self, client: RemoteClient, layout: Layout, block_bytes: int,
                 snapshot_bytes: int) -> None:
        """block_bytes, snapshot_bytes: logical sizes of a block and a snapshot (the
        planner's estimate of what a read moves until HEAD says better)."""
        self.client, self.layout = client, layout
        self.fanout = client.config.concurrency
        self.block_bytes, self.snapshot_bytes = block_bytes, snapshot_bytes
        self.lookups = self.requests = 0

    def find(self, chain: KeyChain, tokens: list[int], limit: int, first: int,
             floor: int, hybrid: bool) -> Found:
        """The remote's blocks first .. D-1 of the prompt (D the deepest present, found
        by search) and the snapshots after them that cover more than `floor` tokens and
        at most `limit`. first: blocks before it are held locally."""
        t0 = time.perf_counter()
        out = Found(deadline=t0 + self.client.config.lookup_timeout)
        B, fp = chain.block_size, self.layout.fp
        n_full = min(limit // B, len(chain))
        sizes: list[int] = []
        try:
            depth = self._depth(chain.keys, first, n_full, sizes, out)
            stored = sum(sizes) // len(sizes) if sizes else self.block_bytes
            for i in range(first, depth):
                out.blocks[chain.keys[i]] = EntryMeta(
                    BLOCK, chain.parent(i), (i + 1) * B, tokens[i * B:(i + 1) * B], fp,
                    stored_bytes=stored, logical_bytes=self.block_bytes,
                    plain=chain.ctx.plain(i, B))
            # Attention-only models restore at any block boundary: only a partial page
            # after the deepest block is worth a LIST there.
            low = max(floor // B, 0) if hybrid else depth
            self._snapshots(chain, tokens, limit, depth, low, floor, out)
        except RemoteError:
            out.failed = True
        out.seconds = time.perf_counter() - t0
        self.lookups += 1
        self.requests += out.requests
        return out

    def _depth(self, keys: list[bytes], lo: int, hi: int, sizes: list[int],
               out: Found) -> int:
        """The deepest D in [lo, hi] with block D-1 on the remote, assuming blocks lo ..
        D-1 all are (see the module docstring)."""
        while lo < hi:
            span = hi - lo
            points = sorted({lo + max(1, span * (j + 1) // self.fanout)
                             for j in range(min(self.fanout, span))})
            got = self._parallel(self.client.head, [self.layout.value(keys[p - 1], BLOCK)
                                                    for p in points], out)
            new_lo = lo
            for p, size in zip(points, got):
                if size is None:
                    hi = p - 1
                    break
                sizes.append(size)
                new_lo = p
            lo = new_lo
        return lo

    def _snapshots(self, chain: KeyChain, tokens: list[int], limit: int, top: int, low: int,
                   floor: int, out: Found) -> None:
        """LIST the markers after depths top, top-1, .. low (at most max_lists of them),
        a batch at a time, until a batch finds a snapshot of this prompt."""
        B, fp, ctx = chain.block_size, self.layout.fp, chain.ctx
        depths = list(range(top, low - 1, -1))[:self.client.config.max_lists]
        for s in range(0, len(depths), self.fanout):
            batch = depths[s:s + self.fanout]
            listed = self._parallel(
                self.client.list, [self.layout.markers_of(chain.parent(d)) for d in batch], out)
            for d, objs in zip(batch, listed):
                parent = chain.parent(d)
                have = {}
                for o in objs:
                    parsed = self.layout.parse(o.name)
                    if parsed is not None and parsed[0] == "marker":
                        have[parsed[1]] = o
                if not have:
                    continue
                for r in range(min(B, limit - d * B + 1)):
                    P = d * B + r
                    if P <= floor or P == 0:
                        continue
                    tail = tokens[d * B:P]
                    key = snapshot_key(parent, tail, d, B, ctx)
                    if key in have:
                        meta = EntryMeta(SNAPSHOT, parent, P, tail, fp,
                                         stored_bytes=self.snapshot_bytes,
                                         logical_bytes=self.snapshot_bytes,
                                         plain=ctx.plain(d, B))
                        out.snaps.setdefault(parent, []).append((key, meta))
            if out.snaps:
                return

    def _parallel(self, fn, names: list[str], out: Found) -> list:
        """fn(name) for each name on the client's pool; RemoteError when one failed or
        the lookup's time is up (a slow remote must not hold up the engine's step)."""
        futs = [self.client.pool.submit(fn, n) for n in names]
        done, late = wait(futs, timeout=max(0.0, out.deadline - time.perf_counter()))
        out.requests += len(futs)
        if late:
            for f in late:
                f.cancel()
            self.client.gave_up("lookup", self.client.config.lookup_timeout)
            raise RemoteError("timeout", "the remote did not answer the lookup in time")
        return [f.result() for f in futs]

"""The shared remote tier: cached state in an S3-compatible bucket, below LMDB.

    client     boto3 in threads, counted, with a cool-off after failures (client.py)
    layout     object names: segments of blocks, state objects (layout.py)
    uploader   write-behind from LMDB, in segments and states (uploader.py, publish.py)
    finder     the deepest state of a prompt: a LIST round and a head GET (finder.py)
    fetcher    a plan's pieces by ranged GETs, decoded as they come (fetch.py; the
               locations, ranges and a transfer in progress: ranges.py)
    known      segments known to be there: what uploads name instead of putting again
    sweep      states naming a segment a reader found corrupt or gone, deleted with it
    lost       what a fetch or a lookup found gone, recorded as departures (cache/why/)

The store consults it last: a plan reads device, RAM and LMDB first, and the remote
only for the blocks and snapshot beyond them (cache/restorer.py decides whether that
is worth its requests and bytes).
"""

from __future__ import annotations

import logging

from ckptd.cache.keys import KeyChain
from ckptd.cache.lookup import REMOTE, IndexView, RestorePlan, plan_restore
from ckptd.cache.remote import frames
from ckptd.cache.remote.client import RemoteClient, RemoteConfig, RemoteError
from ckptd.cache.remote.fetch import Fetcher
from ckptd.cache.remote.finder import Finder, LayeredView
from ckptd.cache.remote.layout import STATE, Layout, grid_for
from ckptd.cache.remote.lost import BAD_HEAD
from ckptd.cache.remote.publish import Chain, Known, ReadValues
from ckptd.cache.remote.sweep import sweep
from ckptd.cache.remote.uploader import Uploader
from ckptd.cache.why.gone import CORRUPT, Gone
from ckptd.model.spec import StateSpec

log = logging.getLogger(__name__)


class RemoteTier:
    name = "remote"

    def __init__(self, config: RemoteConfig, fingerprint: str, spec: StateSpec,
                 upload: bool = True) -> None:
        """upload=False: reads only (a daemon that must not write). Uploads start
        once a store attaches its LMDB (`attach`)."""
        self.config, self.upload, self.spec = config, upload, spec
        self.client = RemoteClient(config)
        self.block_bytes = spec.page_bytes() if spec.attention is not None else 0
        self.layout = Layout(config.url, fingerprint, grid_for(config.segment_bytes,
                                                               self.block_bytes))
        self.known = Known()
        self.fetcher = Fetcher(self.client, forget=self.known.forget,
                               sweep=lambda owner, names: sweep(self.client, self.layout,
                                                                owner, names))
        self.finder = Finder(self.client, self.layout, self.fetcher)
        if spec.attention is not None:
            self.finder.tensor = frames.tensor_of(spec.kv_dtype, spec.kv_shape())
            self.finder.block_bytes = self.block_bytes
        self.uploader: Uploader | None = None
        self.skipped = 0             # lookups that did not ask the remote (cooling off)
        self.gone: Gone | None = None    # the store's records of departed entries

    def available(self) -> bool:
        return self.client.available()

    def latency(self) -> float:
        """Seconds per small request, as measured."""
        return self.client.latency_ema

    @property
    def search_rounds(self) -> int:
        """Round trips a lookup costs: a batch of LISTs, a state's head."""
        return 2

    def plan(self, local: IndexView, tokens: list[int], limit: int, chain: KeyChain,
             device_blocks: int, floor: int) -> RestorePlan | None:
        """The deepest restorable state of tokens[:limit] over the local tiers and the
        remote, or None when the remote was not asked (cooling off after failures).
        floor: what the local tiers restore alone (the remote must beat it)."""
        if not self.available():
            self.skipped += 1
            return None
        n_full = min(limit // chain.block_size, len(chain))
        first = device_blocks
        for hit in local.find_many(chain.keys[device_blocks:n_full]):
            if hit is None:
                break
            first += 1
        found = self.finder.find(chain, tokens, limit, first, floor)
        if found.dropped and self.gone is not None:
            self.gone.left(found.dropped, CORRUPT, REMOTE, BAD_HEAD)
        for ref, keys, _ in found.segments:
            if ref.framed:                     # named by a state: an upload names it too
                self.known.add(ref, keys)      # (a new state names framed segments only)
        plan = plan_restore(tokens, limit, chain, self.spec.is_hybrid,
                            LayeredView(local, found), device_blocks)
        plan.remote = found
        return plan

    def attach(self, chain: Chain, read: ReadValues) -> None:
        """Start uploading what the store commits: chain(block key) walks its prefix in
        the store's index, read(items) gives committed values back."""
        if self.upload and self.uploader is None:
            self.uploader = Uploader(self.client, self.layout, self.known, chain, read,
                                     self.spec.block_size, self.block_bytes)

    def offer(self, items) -> None:
        """Committed entries (key, meta, LMDB value), queued for upload."""
        if self.uploader is not None:
            self.uploader.offer(items)

    def flush(self, timeout: float | None = None) -> bool:
        return True if self.uploader is None else self.uploader.flush(timeout)

    def states(self) -> list[tuple[int, bytes, str]]:
        """Every state of this model on this grid, as (position, key, object name): a
        LIST of the whole layout (tools and tests)."""
        out = []
        for o in self.client.list(f"{self.layout.root}state/"):
            parsed = self.layout.parse(o.name)
            if parsed is not None and parsed[0] == STATE:
                out.append((parsed[3], parsed[2], o.name))
        return sorted(out)

    def check(self) -> str | None:
        """Why the remote can't be used now (logged at start), or None."""
        try:
            return self.client.check()
        except RemoteError as e:
            return str(e)

    def stats(self) -> dict:
        out = self.client.stats()
        out.update(root=self.layout.root, grid_blocks=self.layout.grid,
                   uploads=self.uploader.stats() if self.uploader else None,
                   fetch=self.fetcher.stats(),
                   lookups={"asked": self.finder.lookups, "requests": self.finder.requests,
                            "skipped": self.skipped, "corrupt": self.finder.corrupt})
        return out

    def close(self) -> None:
        if self.uploader is not None:
            self.uploader.close()
        self.fetcher.close()
        self.client.close()

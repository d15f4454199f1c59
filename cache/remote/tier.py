"""The remote tier: one S3-compatible bucket shared by many daemons, behind the tier
interface (cache/tier.py) like LMDB, its values the same bytes LMDB stores.

Its parts, each small:

    client     boto3 in threads; counters; a cool-off after failures (client.py)
    layout     object names and the object frame (layout.py)
    uploader   write-behind after LMDB commits (uploader.py)
    finder     what the remote holds of a prompt, for restore planning (finder.py)
    fetcher    a plan's remote pieces, checked, within a deadline (fetch.py)

The store consults it last: a plan reads device, RAM and LMDB first, and the remote
only for the blocks and snapshot beyond them (cache/restorer.py decides whether that
is worth its requests and bytes).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ckptd.cache import codec
from ckptd.cache.entry import BLOCK, SNAPSHOT, EntryMeta
from ckptd.cache.keys import KeyChain
from ckptd.cache.lookup import IndexView, RestorePlan, plan_restore
from ckptd.cache.remote.client import RemoteClient, RemoteConfig, RemoteError
from ckptd.cache.remote.fetch import Fetcher
from ckptd.cache.remote.finder import Finder, LayeredView
from ckptd.cache.remote.layout import Layout, pack, unpack
from ckptd.cache.remote.uploader import Read, Uploader
from ckptd.model.spec import StateSpec

log = logging.getLogger(__name__)


class RemoteTier:
    name = "remote"

    def __init__(self, config: RemoteConfig, fingerprint: str,
                 spec: StateSpec | None = None, upload: bool = True) -> None:
        """upload=False: reads only (a daemon that must not write). Uploads start
        once a store attaches its LMDB (`attach`)."""
        self.config, self.upload = config, upload
        self.client = RemoteClient(config)
        self.layout = Layout(config.url, fingerprint)
        self.uploader: Uploader | None = None
        self.fetcher = Fetcher(self.client, self.layout)
        self.spec = spec
        self.finder = None
        if spec is not None:
            block = spec.page_bytes() if spec.attention is not None else 0
            self.finder = Finder(self.client, self.layout, block,
                                 spec.snapshot_bytes(spec.block_size // 2))
        self.skipped = 0             # lookups that did not ask the remote (cooling off)

    def available(self) -> bool:
        return self.client.available()

    def latency(self) -> float:
        """Seconds per small request, as measured."""
        return self.client.latency_ema

    def plan(self, local: IndexView, tokens: list[int], limit: int, chain: KeyChain,
             device_blocks: int, floor: int) -> RestorePlan | None:
        """The deepest restorable state of tokens[:limit] over the local tiers and the
        remote, or None when the remote was not asked (cooling off after failures).
        floor: what the local tiers restore alone (the remote must beat it)."""
        if self.finder is None:
            raise ValueError("this remote tier was opened without a model spec")
        if not self.available():
            self.skipped += 1
            return None
        B, hybrid = chain.block_size, self.spec.is_hybrid
        n_full = min(limit // B, len(chain))
        keys = chain.keys[device_blocks:n_full]
        first = device_blocks
        for hit in local.find_many(keys):
            if hit is None or hit[0].kind != BLOCK:
                break
            first += 1
        found = self.finder.find(chain, tokens, limit, first, floor, hybrid)
        plan = plan_restore(tokens, limit, chain, hybrid, LayeredView(local, found),
                            device_blocks)
        plan.remote = found.metas
        return plan

    def attach(self, read: Read) -> None:
        """Start uploading what the store commits; read(key, kind) gives it back."""
        if self.upload and self.uploader is None:
            self.uploader = Uploader(self.client, self.layout, read)

    def offer(self, items) -> None:
        """Committed entries (key, meta, LMDB value), queued for upload."""
        if self.uploader is not None:
            self.uploader.offer(items)

    def flush(self, timeout: float | None = None) -> bool:
        return True if self.uploader is None else self.uploader.flush(timeout)

    def get(self, key: bytes) -> bytes | None:
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return [None if (found := self._read(k)) is None else bytes(found[1]) for k in keys]

    def meta(self, key: bytes) -> EntryMeta | None:
        found = self._read(key)
        return None if found is None else found[0]

    def _read(self, key: bytes, kind: str | None = None):
        """(meta, value) of the object stored under key; None when there is none or
        it fails its checks."""
        for k in (kind,) if kind else (BLOCK, SNAPSHOT):
            body = self.client.get(self.layout.value(key, k))
            if body is None:
                continue
            try:
                return unpack(body, key, self.layout.fp)
            except codec.CorruptValue:
                return None
        return None

    def put(self, key: bytes, meta: EntryMeta, value: bytes) -> bool:
        """Upload one entry now (not through the queue); False when it was there."""
        written = self.client.put(self.layout.value(key, meta.kind), pack(meta, value))
        if meta.kind == SNAPSHOT:
            self.client.put(self.layout.marker(meta.parent, key), b"")
        return written

    def put_many(self, items: Sequence[tuple[bytes, EntryMeta, bytes]]) -> list[bytes]:
        return [k for k, m, v in items if self.put(k, m, v)]

    def contains(self, key: bytes) -> bool:
        return any(self.client.head(self.layout.value(key, k)) is not None
                   for k in (BLOCK, SNAPSHOT))

    def delete(self, key: bytes) -> None:
        names = [self.layout.value(key, k) for k in (BLOCK, SNAPSHOT)]
        meta = self.meta(key)
        if meta is not None and meta.kind == SNAPSHOT:
            names.append(self.layout.marker(meta.parent, key))
        self.client.delete(names)

    def scan(self) -> list[tuple[bytes, EntryMeta]]:
        """Every entry of this model, read whole: costs a GET per object."""
        out = []
        for o in self.client.list(self.layout.root):
            parsed = self.layout.parse(o.name)
            if parsed is not None and parsed[0] != "marker":
                found = self._read(parsed[1], parsed[0])
                if found is not None:
                    out.append((parsed[1], found[0]))
        return out

    def check(self) -> str | None:
        """Why the remote can't be used now (logged at start), or None."""
        try:
            return self.client.check()
        except RemoteError as e:
            return str(e)

    def stats(self) -> dict:
        out = self.client.stats()
        out.update(root=self.layout.root,
                   uploads=self.uploader.stats() if self.uploader else None,
                   fetch=self.fetcher.stats(),
                   lookups={"asked": self.finder.lookups if self.finder else 0,
                            "requests": self.finder.requests if self.finder else 0,
                            "skipped": self.skipped})
        return out

    def close(self) -> None:
        if self.uploader is not None:
            self.uploader.close()
        self.client.close()

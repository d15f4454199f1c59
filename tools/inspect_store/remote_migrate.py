"""`ckptd inspect --remote ... migrate`: the first remote layout (an object per block or
snapshot, cache/remote/legacy.py) rewritten as segments and states, which is what a
daemon reads now.

Every object of the model in the first layout is read and checked; the chains are
rebuilt from the blocks' parent keys; every full cell goes up as its segment and every
snapshot as a state (through the daemon's own publisher, cache/remote/publish.py, so
the result is what a daemon would have put). Then the old objects are deleted. A
snapshot whose blocks are not all there (a failed upload, or gc) is left out: its
state could not be restored anyway. The values are held in memory while it runs.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ckptd.cache import codec
from ckptd.cache.entry import BLOCK, SNAPSHOT, EntryMeta
from ckptd.cache.remote import legacy
from ckptd.cache.remote.layout import Layout, grid_for, model_root
from ckptd.cache.remote.publish import Known, Publisher
from ckptd.tools.inspect_store.remote import RemoteSource, call


def migrate(src: RemoteSource, segment_bytes: int, dry_run: bool = False) -> dict:
    m = src.model()
    fp, c = m.fingerprint, src.client
    root = model_root(src.url, fp)
    parsed = [(o, legacy.parse(root, o.name)) for o in m.legacy]
    wanted = [(o, p) for o, p in parsed if p is not None and p[0] in (BLOCK, SNAPSHOT)]

    def read(item) -> tuple[bytes, EntryMeta, bytes] | None:
        o, (kind, key) = item
        body = c.get(o.name)
        try:
            meta, value = legacy.unpack(body, key, fp) if body is not None else (None, None)
        except codec.CorruptValue:
            return None
        return None if meta is None or meta.kind != kind else (key, meta, bytes(value))
    got = [g for g in call(lambda: list(c.pool.map(read, wanted))) if g is not None]
    metas = {k: meta for k, meta, _ in got}
    values = {(k, meta.kind): v for k, meta, v in got}
    blocks = [(k, meta) for k, meta in metas.items() if meta.kind == BLOCK]
    out = {"source": src.where, "fingerprint": fp, "dry_run": dry_run,
           "legacy_objects": len(m.legacy), "bad": len(wanted) - len(got), "states": 0,
           "segments": 0, "skipped": 0, "deleted": 0}
    if not blocks and not any(meta.kind == SNAPSHOT for meta in metas.values()):
        return out
    B = len(blocks[0][1].tokens) if blocks else 1
    block_bytes = blocks[0][1].logical_bytes if blocks else 0
    layout = Layout(src.url, fp, grid_for(segment_bytes, block_bytes))

    def chain(key: bytes):
        keys, meta = [], metas.get(key)
        while meta is not None and meta.kind == BLOCK:
            keys.append(key)
            if not meta.has_block_parent:
                return meta.parent, keys[::-1]
            key, meta = meta.parent, metas.get(meta.parent)
        return None

    with ThreadPoolExecutor(c.config.concurrency) as pool:
        pub = Publisher(c, layout, Known(), chain,
                        lambda items: [values.get(i) for i in items], B, block_bytes, pool)
        cells = pub.cells([k for k, meta in blocks if (meta.position // B) % layout.grid == 0])
        snaps = sorted(((k, m) for k, m in metas.items() if m.kind == SNAPSHOT),
                       key=lambda s: -s[1].position)
        states = [pub.state_job(k, meta) for k, meta in snaps]
        out["skipped"] = sum(1 for s in states if s is None)
        out["grid_blocks"] = layout.grid
        if dry_run:
            out["states"] = len(states) - out["skipped"]
            return out
        pub.run(cells, [s for s in states if s is not None])
    n = pub.counts
    out.update(states=n.states, segments=n.segments, exists=n.exists, failed=n.failed)
    if not n.failed:
        out["deleted"] = call(c.delete, [o.name for o in m.legacy])
    return out

"""`ckptd inspect --remote ... verify | gc`: checking one model's objects, and taking
what no state needs.

States are the roots: a state object names the segments it restores from, and a
segment no state names is garbage once it is older than the grace period (younger,
it may belong to an upload whose state is not up yet: a state goes up last).
"""

from __future__ import annotations

import time
from collections import Counter

from ckptd.cache import codec
from ckptd.cache.remote import frames, segment
from ckptd.cache.remote.client import RemoteClient
from ckptd.cache.remote.layout import FRAMED, framed
from ckptd.tools.inspect_store.remote import RemoteSource, call

STALE_UPLOAD = 3600.0          # an incomplete multipart upload this old is abandoned


def verify(src: RemoteSource, drop: bool) -> dict:
    """Read every object of the model whole and check it: state heads and snapshots,
    segment headers and every value (checksum, format, model, key) or frame (checksum,
    size), and that every
    segment a state names is there, as large as the state says (else it dangles).
    With drop, delete the bad objects and the states that dangle."""
    m = src.model()
    fp, c = m.fingerprint, src.client
    heads = src.heads(m, whole=True)

    def check(name: str) -> str | None:
        body = c.get(name)
        if body is None:
            return "gone"
        try:
            parent, last = name.removesuffix(FRAMED).rsplit("/", 2)[-2:]
            if framed(name):
                h = frames.read_header(body)
                for part, f in zip(frames.frame_bodies(body, h), h.frames):
                    frames.unpack(part, f, h.block_bytes)     # its checksum, its size
            else:
                h = segment.read_header(body)
                for key, value in zip(h.keys, segment.values(body, h)):
                    codec.verify(value, fp, key)
            if (h.parent.hex(), h.keys[-1].hex()) != (parent, last):
                raise codec.CorruptValue("its blocks are not the ones its name says")
        except codec.CorruptValue as e:
            return f"bad: {e}"
        return None
    names = list(m.segments)
    seg_bad = {n: why for n, why in zip(names, call(lambda: list(c.pool.map(check, names))))
               if why is not None and why != "gone"}
    bad_states = [n for n, h in heads.items() if isinstance(h, str) and h != "gone"]
    dangling, used = [], set()
    for name, h in heads.items():
        if isinstance(h, str):
            continue
        for ref in h.segments:
            used.add(ref.name)
        if any(r.name not in m.segments or m.segments[r.name].size != r.size
               or r.name in seg_bad for r in h.segments):
            dangling.append(name)
    dropped = 0
    if drop:
        dropped = call(c.delete, bad_states + list(seg_bad) + dangling)
    return {"source": src.where, "fingerprint": fp,
            "checked": len(m.states) + len(m.segments), "states": len(m.states),
            "segments": len(m.segments), "bad": sorted(bad_states + list(seg_bad)),
            "dangling": sorted(dangling),
            "unreferenced": sum(1 for n in m.segments if n not in used),
            "legacy_objects": len(m.legacy), "dropped": dropped}


def gc(src: RemoteSource, older_than: float | None, to_bytes: int | None, grace: float,
       dry_run: bool = False) -> dict:
    """Delete the model's states older than older_than seconds, then the oldest until
    what is left fits to_bytes; then every segment no state left names that is older
    than `grace` seconds. Objects of the first layout go by age and size as well."""
    if older_than is None and to_bytes is None:
        raise ValueError("gc --remote needs --older-than AGE, --to SIZE, or both")
    m = src.model()
    heads = src.heads(m)
    now = time.time()
    refs: Counter[str] = Counter()
    for h in heads.values():
        if not isinstance(h, str):
            refs.update({r.name for r in h.segments})
    total = sum(o.size for o in m.segments.values()) + \
        sum(o.size for o, *_ in m.states.values()) + sum(o.size for o in m.legacy)
    # What would go if nothing else did: segments no state names, old enough.
    loose = {n for n, o in m.segments.items() if not refs[n] and now - o.modified > grace}
    freed = sum(m.segments[n].size for n in loose)

    def due(modified: float) -> bool:
        return (older_than is not None and now - modified > older_than) or \
            (to_bytes is not None and total - freed > to_bytes)
    roots = sorted([(o.modified, o.size, n) for n, (o, *_) in m.states.items()] +
                   [(o.modified, o.size, o.name) for o in m.legacy])
    gone = []
    for modified, size, name in roots:
        if not due(modified):
            continue
        gone.append(name)
        freed += size
        h = heads.get(name)
        if h is None or isinstance(h, str):
            continue
        for n in {r.name for r in h.segments}:
            refs[n] -= 1
            o = m.segments.get(n)
            if not refs[n] and o is not None and now - o.modified > grace and n not in loose:
                loose.add(n)
                freed += o.size
    names = gone + sorted(loose)
    deleted = len(names) if dry_run else call(src.client.delete, names)
    aborted = 0 if dry_run else _abort_stale(src.client, src.model_prefix())
    return {"source": src.where, "fingerprint": m.fingerprint, "dry_run": dry_run,
            "grace_s": grace, "objects_before": len(m.segments) + len(m.states) + len(m.legacy),
            "bytes_before": total, "deleted_states": sum(1 for n in gone if n in m.states),
            "deleted_legacy": sum(1 for n in gone if n not in m.states),
            "deleted_segments": len(loose), "deleted_objects": deleted,
            "bytes_after": total - freed, "aborted_uploads": aborted}


def _abort_stale(client: RemoteClient, root: str) -> int:
    """Abort multipart uploads under the model's root begun over STALE_UPLOAD ago (a
    daemon killed mid-upload leaves parts that cost storage and never show in LIST)."""
    s3, bucket, n = client.s3, client.url.bucket, 0
    try:
        r = s3.list_multipart_uploads(Bucket=bucket, Prefix=root)
        for u in r.get("Uploads", ()):
            if time.time() - u["Initiated"].timestamp() > STALE_UPLOAD:
                s3.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
                n += 1
    except Exception:       # a store without the call: lifecycle rules take them
        return n
    return n

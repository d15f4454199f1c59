"""`ckptd inspect --remote s3://BUCKET/PREFIX`: a shared remote tier, from outside.

    stats     objects, bytes and ages per model fingerprint (and format version)
    ls        one model's objects: key, kind, size, age (names and LIST only)
    verify    read every object of one model and check it; --drop deletes bad ones
    gc        delete one model's objects older than --older-than, then the oldest
              until what is left fits --to; incomplete multipart uploads go too

Endpoint and keys come from the standard AWS settings, as the daemon's do. Only one
fingerprint's objects are ever changed: `--fingerprint`, or the only one there is.
A snapshot and its marker go together; a marker whose snapshot is gone is an orphan.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import defaultdict

from ckptd.cache import codec
from ckptd.cache.entry import BLOCK, SNAPSHOT
from ckptd.cache.keys import FORMAT_VERSION
from ckptd.cache.remote.client import ObjectInfo, RemoteClient, RemoteConfig, RemoteError
from ckptd.cache.remote.layout import Layout, RemoteURL, formats_root, unpack
from ckptd.daemon.config import parse_size
from ckptd.tools.inspect_store import render

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SORTS = {"size": lambda r: r["bytes"], "last_used": lambda r: r["modified"],
          "created": lambda r: r["modified"]}
STALE_UPLOAD = 3600.0          # an incomplete multipart upload this old is abandoned


def parse_age(text: str, name: str = "--older-than") -> float:
    """'7d' -> 604800.0, '12h', '30m', '90s', '3600' (seconds)."""
    m = _AGE.match(str(text))
    if m is None:
        raise ValueError(f"{name}: not an age: {text!r} (examples: 3600, 90m, 12h, 7d)")
    return float(m.group(1)) * _SECONDS[m.group(2)]


class RemoteSource:
    def __init__(self, url: str, fingerprint: str | None = None) -> None:
        self.url = RemoteURL.parse(url)
        self.where = str(self.url)
        self.wanted = fingerprint
        self._fp: str | None = None
        self._client: RemoteClient | None = None

    @property
    def client(self) -> RemoteClient:
        if self._client is None:
            self._client = RemoteClient(RemoteConfig(self.url))
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def _all(self) -> list[tuple[str, str, ObjectInfo]]:
        """(format version, fingerprint, object) of everything ckptd wrote here."""
        root = formats_root(self.url)
        out = []
        for o in _call(self.client.list, root):
            parts = o.name[len(root):].split("/")
            if len(parts) >= 3 and parts[0].startswith("v"):
                out.append((parts[0][1:], parts[1], o))
        return out

    def fingerprint(self) -> str:
        """The model whose objects an action reads or changes."""
        if self._fp is None:
            found = sorted({fp for v, fp, _ in self._all() if v == str(FORMAT_VERSION)})
            if self.wanted:
                self._fp = self.wanted
            elif len(found) == 1:
                self._fp = found[0]
            else:
                raise ValueError(f"{self.where} holds objects of {len(found)} models: name "
                                 f"one with --fingerprint ({', '.join(found) or 'none'})")
        return self._fp

    def objects(self) -> tuple[Layout, list[dict], dict[bytes, ObjectInfo]]:
        """This model's values as rows (key, kind, bytes, modified, name) and its
        markers by the key of the snapshot they point to."""
        layout = Layout(self.url, self.fingerprint())
        rows, markers = [], {}
        for o in _call(self.client.list, layout.root):
            parsed = layout.parse(o.name)
            if parsed is None:
                continue
            what, key, _ = parsed
            if what == "marker":
                markers[key] = o
            else:
                rows.append({"key": key.hex(), "kind": what, "bytes": o.size,
                             "modified": o.modified, "name": o.name})
        return layout, rows, markers


def _call(fn, *args):
    try:
        return fn(*args)
    except RemoteError as e:
        raise ValueError(str(e)) from None


def stats(src: RemoteSource) -> dict:
    by: dict = defaultdict(lambda: {"objects": 0, "blocks": 0, "snapshots": 0, "markers": 0,
                                    "bytes": 0, "oldest": None, "newest": None})
    for version, fp, o in src._all():
        row = by[(version, fp)]
        row["objects"] += 1
        kind = o.name.rsplit("/", 2)[-2] if o.name.count("/") >= 2 else ""
        if "/after/" in o.name:
            row["markers"] += 1
        elif kind == "block":
            row["blocks"] += 1
        elif kind == "snapshot":
            row["snapshots"] += 1
        row["bytes"] += o.size
        row["oldest"] = o.modified if row["oldest"] is None else min(row["oldest"], o.modified)
        row["newest"] = o.modified if row["newest"] is None else max(row["newest"], o.modified)
    models = [{"format_version": v, "fingerprint": fp, **row}
              for (v, fp), row in sorted(by.items())]
    return {"source": src.where, "endpoint": src.client.endpoint,
            "objects": sum(m["objects"] for m in models),
            "bytes": sum(m["bytes"] for m in models), "models": models}


def ls(src: RemoteSource, sort: str, kind: str | None, offset: int, limit: int) -> dict:
    if sort not in _SORTS:
        raise ValueError(f"--sort for --remote is one of {', '.join(sorted(_SORTS))}: "
                         "objects have a size and a time, not hits or positions")
    if limit < 0 or offset < 0:
        raise ValueError("--limit and --offset must be >= 0")
    _, rows, markers = src.objects()
    rows = [r for r in rows if kind in (None, r["kind"])]
    rows.sort(key=_SORTS[sort], reverse=True)
    end = None if limit == 0 else offset + limit
    return {"source": src.where, "fingerprint": src.fingerprint(), "sort": sort,
            "kind": kind, "total": len(rows), "offset": offset, "limit": limit,
            "entries": [{k: r[k] for k in ("key", "kind", "bytes", "modified")}
                        for r in rows[offset:end]]}


def verify(src: RemoteSource, drop: bool) -> dict:
    """Read and check every object of the model: frame and value checksums, format,
    model, key. With drop, delete the bad ones, with their markers, and orphan markers."""
    layout, rows, markers = src.objects()
    fp, client = layout.fp, src.client
    futs = [(r, client.pool.submit(client.get, r["name"])) for r in rows]
    bad = []
    for r, fut in futs:
        try:
            body = fut.result()
            if body is None:
                continue                        # deleted meanwhile
            meta, _ = unpack(body, bytes.fromhex(r["key"]), fp)
            if meta.kind != r["kind"]:
                raise codec.CorruptValue("a block stored as a snapshot, or the reverse")
        except codec.CorruptValue:
            bad.append(r)
        except RemoteError as e:
            raise ValueError(str(e)) from None
    snaps = {bytes.fromhex(r["key"]) for r in rows if r["kind"] == SNAPSHOT}
    orphans = [o for k, o in markers.items() if k not in snaps]
    dropped = 0
    if drop:
        names = [r["name"] for r in bad] + [o.name for o in orphans]
        names += [markers[bytes.fromhex(r["key"])].name for r in bad
                  if bytes.fromhex(r["key"]) in markers]
        dropped = _call(client.delete, names)
    return {"source": src.where, "fingerprint": fp, "checked": len(rows),
            "bad": [r["key"] for r in bad], "orphans": [o.name for o in orphans],
            "dropped": dropped}


def gc(src: RemoteSource, older_than: float | None, to_bytes: int | None,
       dry_run: bool = False) -> dict:
    """Delete the model's objects older than older_than seconds, then the oldest until
    at most to_bytes are left (a snapshot's marker with it; orphan markers too)."""
    if older_than is None and to_bytes is None:
        raise ValueError("gc --remote needs --older-than AGE, --to SIZE, or both")
    layout, rows, markers = src.objects()
    now = time.time()
    rows.sort(key=lambda r: r["modified"])
    total = sum(r["bytes"] for r in rows)
    gone, freed = [], 0
    for r in rows:
        old = older_than is not None and now - r["modified"] > older_than
        over = to_bytes is not None and total - freed > to_bytes
        if not (old or over):
            continue
        gone.append(r)
        freed += r["bytes"]
    keys = {bytes.fromhex(r["key"]) for r in gone}
    left = {bytes.fromhex(r["key"]) for r in rows if r["kind"] == SNAPSHOT} - keys
    names = [r["name"] for r in gone] + [o.name for k, o in markers.items() if k not in left]
    deleted = len(names) if dry_run else _call(src.client.delete, names)
    aborted = 0 if dry_run else _abort_stale(src.client, layout.root)
    return {"source": src.where, "fingerprint": layout.fp, "dry_run": dry_run,
            "objects_before": len(rows), "bytes_before": total,
            "deleted_values": len(gone), "deleted_blocks": sum(
                1 for r in gone if r["kind"] == BLOCK), "deleted_objects": deleted,
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


ACTIONS = ("stats", "ls", "verify", "gc")


def run(args) -> int:
    """The --remote side of `ckptd inspect` (tools/inspect_store/command.py)."""
    if args.url or args.cache_dir:
        raise ValueError("give --remote, or --cache-dir / --url, not both")
    if args.action not in ACTIONS:
        raise ValueError(f"{args.action} works on a local store or a daemon; --remote "
                         f"takes {', '.join(ACTIONS)}")
    src = RemoteSource(args.remote, args.fingerprint)
    code = 0
    try:
        if args.action == "stats":
            out = stats(src)
        elif args.action == "ls":
            out = ls(src, args.sort, args.kind, args.offset, args.limit)
        elif args.action == "verify":
            out = verify(src, args.drop)
            code = 1 if (out["bad"] or out["orphans"]) and not args.drop else 0
        else:
            out = gc(src, parse_age(args.older_than) if args.older_than else None,
                     parse_size(args.to, "--to") if args.to is not None else None, args.dry_run)
    finally:
        src.close()
    if args.json:
        print(json.dumps(out, indent=1 if sys.stdout.isatty() else None))
    else:
        _show(args.action, out)
    return code


def _show(action: str, out: dict) -> None:
    console = render.console()
    h = render.human_bytes
    if action == "stats":
        t = render._table(f"remote {out['source']} ({out['endpoint']})", "format",
                          "fingerprint", "blocks", "snapshots", "markers", "bytes", "oldest",
                          "newest")
        for m in out["models"]:
            t.add_row(f"v{m['format_version']}", m["fingerprint"], str(m["blocks"]),
                      str(m["snapshots"]), str(m["markers"]), h(m["bytes"]),
                      render.age(m["oldest"]), render.age(m["newest"]))
        console.print(t)
        console.print(f"{out['objects']} objects, {h(out['bytes'])}")
    elif action == "ls":
        t = render._table(f"{out['source']} model {out['fingerprint']}: {out['total']} "
                          "objects", "key", "kind", "bytes", "stored")
        for e in out["entries"]:
            t.add_row(e["key"], e["kind"], h(e["bytes"]), render.age(e["modified"]))
        console.print(t)
    elif action == "verify":
        render.message(console, f"checked {out['checked']} objects: {len(out['bad'])} bad, "
                                f"{len(out['orphans'])} orphan markers, {out['dropped']} "
                                "deleted")
        for k in out["bad"]:
            console.print(f"  bad: {k}")
    else:
        verb = "would delete" if out["dry_run"] else "deleted"
        render.message(console, f"{verb} {out['deleted_values']} values "
                                f"({out['deleted_objects']} objects with markers): "
                                f"{h(out['bytes_before'])} -> {h(out['bytes_after'])}")

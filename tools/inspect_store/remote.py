"""`ckptd inspect --remote s3://BUCKET/PREFIX`: a shared remote tier, from outside.

    stats     per model and grid: segments, states, bytes, the dedup ratio (bytes the
              states restore / bytes stored), objects of the first layout
    ls        one model's objects: state (position, key) or segment, size, age
    verify    read every object of one model and check it: segment and state heads,
              every value, and that each state's segments are there (a state naming a
              missing one dangles); --drop deletes the bad and the dangling
    gc        delete states older than --older-than, then the oldest until what is left
              fits --to; then segments no state names, older than --grace
    migrate   rewrite objects of the first layout (one per block) as segments and
              states, then delete them

Endpoint and keys come from the standard AWS settings, as the daemon's do. Only one
fingerprint's objects are ever changed: `--fingerprint`, or the only one there is.
The actions' work is in remote_check.py (verify, gc) and remote_migrate.py; running
and showing them in remote_command.py.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from ckptd.cache import codec
from ckptd.cache.keys import FORMAT_VERSION
from ckptd.cache.remote import legacy
from ckptd.cache.remote import state as state_obj
from ckptd.cache.remote.client import ObjectInfo, RemoteClient, RemoteConfig, RemoteError
from ckptd.cache.remote.layout import FRAMED, SEGMENT, Layout, RemoteURL, formats_root, model_root

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SORTS = {"size": lambda r: r["bytes"], "last_used": lambda r: r["modified"],
          "created": lambda r: r["modified"]}
_GRID = re.compile(r"^g(\d+)$")


def parse_age(text: str, name: str = "--older-than") -> float:
    """'7d' -> 604800.0, '12h', '30m', '90s', '3600' (seconds)."""
    m = _AGE.match(str(text))
    if m is None:
        raise ValueError(f"{name}: not an age: {text!r} (examples: 3600, 90m, 12h, 7d)")
    return float(m.group(1)) * _SECONDS[m.group(2)]


@dataclass
class Model:
    """One model's objects under the URL, by what they are."""
    fingerprint: str
    segments: dict[str, ObjectInfo] = field(default_factory=dict)
    states: dict[str, tuple[ObjectInfo, Layout, bytes, int]] = field(default_factory=dict)
    legacy: list[ObjectInfo] = field(default_factory=list)
    layouts: dict[int, Layout] = field(default_factory=dict)


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

    def model_prefix(self) -> str:
        return model_root(self.url, self.fingerprint())

    def _all(self) -> list[tuple[str, str, ObjectInfo]]:
        """(format version, fingerprint, object) of everything ckptd wrote here."""
        root = formats_root(self.url)
        out = []
        for o in call(self.client.list, root):
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

    def model(self, fingerprint: str | None = None,
              listed: list[ObjectInfo] | None = None) -> Model:
        """A model's objects (the chosen one's by default)."""
        fp = fingerprint or self.fingerprint()
        root = model_root(self.url, fp)
        out = Model(fp)
        objs = listed if listed is not None else call(self.client.list, root)
        for o in objs:
            head = o.name[len(root):].split("/", 1)[0]
            grid = _GRID.match(head)
            if grid is None:
                if legacy.parse(root, o.name) is not None:
                    out.legacy.append(o)
                continue
            g = int(grid.group(1))
            layout = out.layouts.setdefault(g, Layout(self.url, fp, g))
            parsed = layout.parse(o.name)
            if parsed is None:
                continue
            if parsed[0] == SEGMENT:
                out.segments[o.name] = o
            else:
                out.states[o.name] = (o, layout, parsed[2], parsed[3])
        return out

    def heads(self, model: Model, whole: bool = False) -> dict[str, state_obj.StateHead | str]:
        """Each state's head (its snapshot value checked too when whole), or why it is
        bad. One ranged GET a state (the whole object when whole)."""
        c = self.client

        def one(name: str):
            o, layout, _, _ = model.states[name]
            try:
                got = c.get(name) if whole else c.get_range(
                    name, 0, min(o.size, state_obj.FIRST_READ))
                if got is None:
                    return "gone"
                data = got if whole else got[0]
                need = state_obj.head_bytes(data)
                if need > len(data):
                    more = c.get_range(name, len(data), need)
                    data = data + (more[0] if more else b"")
                head = state_obj.read_head(data, model.fingerprint, layout.absolute)
                if whole:
                    codec.verify(memoryview(data)[head.snapshot_at:], model.fingerprint,
                                 head.key)
                return head
            except codec.CorruptValue as e:
                return f"bad: {e}"
        names = list(model.states)
        return dict(zip(names, call(lambda: list(c.pool.map(one, names)))))


def call(fn, *args):
    try:
        return fn(*args)
    except RemoteError as e:
        raise ValueError(str(e)) from None


def referenced(head: state_obj.StateHead) -> int:
    """Bytes of the block values (or frames) a state names."""
    return sum(sum(n for b, _, n in s.frame_spans() if b < s.used) if s.framed
               else sum(s.lengths) for s in head.segments)


def stats(src: RemoteSource) -> dict:
    by: dict = defaultdict(list)
    for version, fp, o in src._all():
        by[(version, fp)].append(o)
    models = []
    for (version, fp), objs in sorted(by.items()):
        row = {"format_version": version, "fingerprint": fp, "objects": len(objs),
               "bytes": sum(o.size for o in objs),
               "oldest": min(o.modified for o in objs), "newest": max(o.modified for o in objs)}
        if version == str(FORMAT_VERSION):
            m = src.model(fp, objs)
            heads = src.heads(m)
            good = [h for h in heads.values() if not isinstance(h, str)]
            seg_bytes = sum(o.size for o in m.segments.values())
            state_bytes = sum(m.states[n][0].size for n in m.states)
            restores = sum(referenced(h) + m.states[n][0].size - h.snapshot_at
                           for n, h in heads.items() if not isinstance(h, str))
            row.update(grids=sorted(m.layouts), segments=len(m.segments),
                       segment_bytes=seg_bytes, states=len(m.states), state_bytes=state_bytes,
                       bad_states=len(heads) - len(good), legacy_objects=len(m.legacy),
                       legacy_bytes=sum(o.size for o in m.legacy), restorable_bytes=restores,
                       dedup_ratio=round(restores / (seg_bytes + state_bytes), 2)
                       if seg_bytes + state_bytes else None)
        models.append(row)
    return {"source": src.where, "endpoint": src.client.endpoint,
            "objects": sum(m["objects"] for m in models),
            "bytes": sum(m["bytes"] for m in models), "models": models}


def ls(src: RemoteSource, sort: str, kind: str | None, offset: int, limit: int) -> dict:
    """kind: "snapshot" lists states, "block" segments (the local store's words)."""
    if sort not in _SORTS:
        raise ValueError(f"--sort for --remote is one of {', '.join(sorted(_SORTS))}: "
                         "objects have a size and a time, not hits or positions")
    if limit < 0 or offset < 0:
        raise ValueError("--limit and --offset must be >= 0")
    m = src.model()
    rows = []
    if kind in (None, "snapshot"):
        rows += [{"kind": "state", "key": key.hex(), "position": pos, "bytes": o.size,
                  "modified": o.modified, "name": o.name}
                 for o, _, key, pos in m.states.values()]
    if kind in (None, "block"):
        rows += [{"kind": "segment", "key": o.name.rsplit("/", 1)[1].removesuffix(FRAMED),
                  "position": None,
                  "bytes": o.size, "modified": o.modified, "name": o.name}
                 for o in m.segments.values()]
    rows.sort(key=_SORTS[sort], reverse=True)
    end = None if limit == 0 else offset + limit
    return {"source": src.where, "fingerprint": m.fingerprint, "sort": sort, "kind": kind,
            "total": len(rows), "offset": offset, "limit": limit, "entries": rows[offset:end]}

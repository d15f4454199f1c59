"""Where cached values live in an S3 bucket, and the bytes of one object.

Names, under `s3://BUCKET/PREFIX`:

    PREFIX/ckptd/v{FORMAT_VERSION}/{fingerprint}/block/{key}             one KV page
    PREFIX/ckptd/v{FORMAT_VERSION}/{fingerprint}/snapshot/{key}          one snapshot
    PREFIX/ckptd/v{FORMAT_VERSION}/{fingerprint}/after/{parent}/{key}    empty: a
        snapshot follows block `parent` (how a lookup finds snapshots with one LIST)

Keys are the cache keys in hex (cache/keys.py). A key is a hash of the prefix's
tokens chained from a root key that covers the fingerprint, format version, block
size and salt, so one tenant's keys never name another's objects, and a daemon
only ever asks for names made from its own keys: salt isolation needs nothing in
the path. The fingerprint and format version are in the path so that `ckptd
inspect --remote ... gc` can take one model's objects (or an old format's) alone.

An object is immutable: its name is its content's address, every writer puts the
same prefix's state under it, and puts are conditional (If-None-Match: *), so no
object is ever rewritten. The body is a small checksummed frame with what rebuilds
the entry's EntryMeta (kind, parent, position, tokens), then exactly the value
LMDB stores (cache/codec.py: its own checksum, format version, fingerprint and key):

    "CKPO" ‖ u32 meta length ‖ meta JSON ‖ xxh3-64 of the bytes before it ‖ value
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass

import xxhash

from ckptd.cache import codec
from ckptd.cache.entry import BLOCK, SNAPSHOT, EntryMeta
from ckptd.cache.keys import FORMAT_VERSION, KEY_BYTES

MAGIC = b"CKPO"
_HEAD = struct.Struct("<4sI")
_SUM = 8
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
KIND_DIRS = {BLOCK: "block", SNAPSHOT: "snapshot"}
_HEX = 2 * KEY_BYTES


@dataclass(frozen=True)
class RemoteURL:
    bucket: str
    prefix: str = ""          # no leading or trailing slash

    @classmethod
    def parse(cls, url: str) -> RemoteURL:
        """s3://bucket or s3://bucket/some/prefix; ValueError naming what is wrong."""
        text = str(url).strip()
        if not text.startswith("s3://"):
            raise ValueError(f"--remote must be s3://BUCKET[/PREFIX], got {url!r}")
        bucket, _, prefix = text[len("s3://"):].partition("/")
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise ValueError(f"--remote: {bucket!r} is not an S3 bucket name (3-63 "
                             "lowercase letters, digits, dots and hyphens)")
        prefix = prefix.strip("/")
        if "//" in prefix or any(c in prefix for c in "\\\0\n\r"):
            raise ValueError(f"--remote: bad prefix {prefix!r}")
        return cls(bucket, prefix)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


class Layout:
    """Object names of one model's values under one URL."""

    def __init__(self, url: RemoteURL, fingerprint: str) -> None:
        if not fingerprint or "/" in fingerprint:
            raise ValueError(f"not a model fingerprint: {fingerprint!r}")
        self.url, self.fp = url, fingerprint
        self.root = f"{formats_root(url)}v{FORMAT_VERSION}/{fingerprint}/"

    def value(self, key: bytes, kind: str) -> str:
        return f"{self.root}{KIND_DIRS[kind]}/{key.hex()}"

    def marker(self, parent: bytes, key: bytes) -> str:
        return f"{self.root}after/{parent.hex()}/{key.hex()}"

    def markers_of(self, parent: bytes) -> str:
        """The prefix a LIST reads to find the snapshots after `parent`."""
        return f"{self.root}after/{parent.hex()}/"

    def parse(self, name: str) -> tuple[str, bytes, bytes | None] | None:
        """(what, key, parent) of an object name under this root: what is BLOCK,
        SNAPSHOT or "marker" (parent set only for markers); None for anything else."""
        if not name.startswith(self.root):
            return None
        parts = name[len(self.root):].split("/")
        try:
            if len(parts) == 2 and parts[0] in ("block", "snapshot") and len(parts[1]) == _HEX:
                return (BLOCK if parts[0] == "block" else SNAPSHOT), bytes.fromhex(parts[1]), None
            if len(parts) == 3 and parts[0] == "after" and len(parts[1]) == len(parts[2]) == _HEX:
                return "marker", bytes.fromhex(parts[2]), bytes.fromhex(parts[1])
        except ValueError:
            return None
        return None


def formats_root(url: RemoteURL) -> str:
    """Everything ckptd writes under a URL: one folder per format version below it."""
    return f"{url.prefix}/ckptd/" if url.prefix else "ckptd/"


def pack(meta: EntryMeta, value: bytes | memoryview) -> bytes:
    """An object's body: the frame naming the entry, then its LMDB value."""
    head = json.dumps({"kind": meta.kind, "parent": meta.parent.hex(),
                       "position": meta.position, "tokens": meta.tokens, "fp": meta.fingerprint,
                       "plain": meta.plain, "logical_bytes": meta.logical_bytes},
                      separators=(",", ":")).encode()
    frame = _HEAD.pack(MAGIC, len(head)) + head
    return b"".join([frame, xxhash.xxh3_64_digest(frame), value])


def unpack(body: bytes | memoryview, key: bytes, fingerprint: str
           ) -> tuple[EntryMeta, memoryview]:
    """(the entry's meta, its value) from an object's body, both checked: the frame's
    checksum, then the value's own (checksum, format version, model and key).
    codec.CorruptValue when anything is off."""
    mv = memoryview(body)
    if len(mv) < _HEAD.size + _SUM:
        raise codec.CorruptValue("object too short")
    magic, n = _HEAD.unpack_from(mv, 0)
    end = _HEAD.size + n
    if magic != MAGIC or len(mv) < end + _SUM:
        raise codec.CorruptValue("not a ckptd object")
    if xxhash.xxh3_64_digest(mv[:end]) != mv[end:end + _SUM]:
        raise codec.CorruptValue("object frame checksum mismatch")
    try:
        d = json.loads(bytes(mv[_HEAD.size:end]))
        meta = EntryMeta(d["kind"], bytes.fromhex(d["parent"]), d["position"], d["tokens"],
                         d["fp"], logical_bytes=d["logical_bytes"], plain=d["plain"])
        meta._check()
    except (ValueError, KeyError, TypeError) as e:
        raise codec.CorruptValue(f"bad object frame: {e}") from None
    if meta.fingerprint != fingerprint:
        raise codec.CorruptValue(f"object of model {meta.fingerprint!r}, expected {fingerprint!r}")
    value = mv[end + _SUM:]
    codec.verify(value, fingerprint, key)
    meta.stored_bytes = len(value)
    return meta, value

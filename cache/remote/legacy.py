"""The first remote layout (one object per block or snapshot), read only to migrate it.

    ROOT/block/{key}             one KV page
    ROOT/snapshot/{key}          one snapshot
    ROOT/after/{parent}/{key}    empty: a snapshot follows block `parent`

ROOT is the model's folder (layout.py: Layout.root). A body is a checksummed frame with
what rebuilds the entry's EntryMeta, then exactly the LMDB value:

    "CKPO" ‖ u32 meta length ‖ meta JSON ‖ xxh3-64 of the bytes before it ‖ value

A restore bound by one request per 16-token block is what the segment layout
replaced; `ckptd inspect --remote ... migrate` rewrites these objects as segments and
state objects (tools/inspect_store/remote_migrate.py). `pack` is kept so tests can
make objects of this layout.
"""

from __future__ import annotations

import json
import struct

import xxhash

from ckptd.cache import codec
from ckptd.cache.entry import BLOCK, SNAPSHOT, EntryMeta
from ckptd.cache.keys import KEY_BYTES

MAGIC = b"CKPO"
_HEAD = struct.Struct("<4sI")
_SUM = 8
_HEX = 2 * KEY_BYTES
DIRS = {BLOCK: "block", SNAPSHOT: "snapshot"}


def name(root: str, key: bytes, kind: str) -> str:
    return f"{root}{DIRS[kind]}/{key.hex()}"


def marker(root: str, parent: bytes, key: bytes) -> str:
    return f"{root}after/{parent.hex()}/{key.hex()}"


def parse(root: str, name: str) -> tuple[str, bytes] | None:
    """(BLOCK, SNAPSHOT or "marker", key) of an object of this layout under root."""
    if not name.startswith(root):
        return None
    parts = name[len(root):].split("/")
    try:
        if len(parts) == 2 and parts[0] in ("block", "snapshot") and len(parts[1]) == _HEX:
            return (BLOCK if parts[0] == "block" else SNAPSHOT), bytes.fromhex(parts[1])
        if len(parts) == 3 and parts[0] == "after" and len(parts[1]) == len(parts[2]) == _HEX:
            return "marker", bytes.fromhex(parts[2])
    except ValueError:
        return None
    return None


def pack(meta: EntryMeta, value: bytes | memoryview) -> bytes:
    head = json.dumps({"kind": meta.kind, "parent": meta.parent.hex(),
                       "position": meta.position, "tokens": meta.tokens, "fp": meta.fingerprint,
                       "plain": meta.plain, "logical_bytes": meta.logical_bytes},
                      separators=(",", ":")).encode()
    frame = _HEAD.pack(MAGIC, len(head)) + head
    return b"".join([frame, xxhash.xxh3_64_digest(frame), value])


def unpack(body: bytes | memoryview, key: bytes, fingerprint: str
           ) -> tuple[EntryMeta, memoryview]:
    """(the entry's meta, its value), both checked (the frame's checksum, then the
    value's own); codec.CorruptValue when anything is off."""
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

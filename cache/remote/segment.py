"""One segment object of the layout before frames (read, no longer written: frames.py):
consecutive blocks of one chain, their LMDB values end to end.

    "CKPS" ‖ u32 count ‖ u64 first block ‖ start parent (16) ‖ count x (key 16 ‖ u32
    length) ‖ xxh3-64 of the bytes before it ‖ values

The header's size follows from the count (header_bytes), so a reader that knows a
segment's length in blocks reads its table with one ranged GET of that size. Each
value is exactly what LMDB stores (cache/codec.py): it carries its own checksum,
format version, model and key, so a ranged read of some values is verified value by
value without the header; the header serves whoever has no state naming the
segment's offsets (an uploader reusing a segment another daemon put, verify, gc).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

from ckptd.cache import codec
from ckptd.cache.keys import KEY_BYTES

MAGIC = b"CKPS"
_HEAD = struct.Struct("<4sIQ16s")          # magic, count, first block, start parent
_ROW = struct.Struct("<16sI")              # key, value length
_SUM = 8


def header_bytes(count: int) -> int:
    return _HEAD.size + count * _ROW.size + _SUM


@dataclass(frozen=True)
class SegmentHeader:
    start: int                    # the first block's index in its chain
    parent: bytes                 # the key before it (the chain's root key for block 0)
    keys: tuple[bytes, ...]
    lengths: tuple[int, ...]

    @property
    def header_bytes(self) -> int:
        return header_bytes(len(self.keys))

    @property
    def size(self) -> int:
        return self.header_bytes + sum(self.lengths)


def pack(start: int, parent: bytes, items: list[tuple[bytes, bytes | memoryview]]) -> bytes:
    """The body of a segment holding blocks start .. start + len(items) - 1: (key,
    LMDB value) each, in chain order."""
    if not items or len(parent) != KEY_BYTES:
        raise ValueError("a segment holds at least one block after a 16-byte parent key")
    head = b"".join([_HEAD.pack(MAGIC, len(items), start, parent),
                     *(_ROW.pack(k, len(v)) for k, v in items)])
    return b"".join([head, xxhash.xxh3_64_digest(head), *(v for _, v in items)])


def read_header(buf: bytes | memoryview) -> SegmentHeader:
    """The header at the start of buf (which may hold only the header);
    codec.CorruptValue when it is damaged or cut short."""
    mv = memoryview(buf)
    if len(mv) < _HEAD.size:
        raise codec.CorruptValue("segment too short")
    magic, count, start, parent = _HEAD.unpack_from(mv, 0)
    end = header_bytes(count) - _SUM
    if magic != MAGIC or count < 1 or len(mv) < end + _SUM:
        raise codec.CorruptValue("not a segment header")
    if xxhash.xxh3_64_digest(mv[:end]) != mv[end:end + _SUM]:
        raise codec.CorruptValue("segment header checksum mismatch")
    rows = [_ROW.unpack_from(mv, _HEAD.size + i * _ROW.size) for i in range(count)]
    return SegmentHeader(start, bytes(parent), tuple(k for k, _ in rows),
                         tuple(n for _, n in rows))


def values(buf: bytes | memoryview, header: SegmentHeader) -> list[memoryview]:
    """Each block's value in a whole segment's body."""
    mv, at, out = memoryview(buf), header.header_bytes, []
    if len(mv) != header.size:
        raise codec.CorruptValue(f"segment of {len(mv)} bytes, its header says {header.size}")
    for n in header.lengths:
        out.append(mv[at:at + n])
        at += n
    return out

"""One state object: where a restorable state's blocks are, then its snapshot.

    "CKPI" ‖ u32 head length ‖ head (zstd JSON) ‖ xxh3-64 of the bytes before it
    ‖ the snapshot's LMDB value

The head is the state's index: its key, position, parent and tail tokens (as the
EntryMeta has them), and the segments that hold blocks 0 .. d-1 (d = P // B), each
as (name below the layout's root, first block, blocks in the object, the object's
size, the lengths of the values this state uses). A reader takes every block's
offset from it and reads only the bytes it needs; the object's size tells it when a
segment under that name is not the one the state was written against (a segment
taken by gc and put again by a daemon whose values compress differently): then the
state is stale for that segment, never its values misread.

A framed segment (frames.py) is a row of seven: (name, first block, blocks, size,
blocks this state uses, its frame table in base64 (u32 blocks, u32 stored bytes,
u64 xxh3 each), where its frames start); the head then names the blocks' tensor
("tensor"). A reader checks each frame it reads against this copy of the table, so
it never reads the segment's own header.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass

import numpy as np
import xxhash
import zstandard

from ckptd.cache import codec
from ckptd.cache.entry import ROLES
from ckptd.cache.remote.frames import Frame
from ckptd.cache.remote.segment import header_bytes

MAGIC = b"CKPI"
_HEAD = struct.Struct("<4sI")
_SUM = 8
_FRAME_ROW = np.dtype([("blocks", "<u4"), ("stored", "<u4"), ("sum", "<u8")])
FIRST_READ = 256 << 10      # what a reader asks for first: the head, often all of it


@dataclass(frozen=True)
class SegmentRef:
    name: str                    # the object's full name
    start: int                   # its first block
    count: int                   # blocks in the object
    size: int                    # the object's bytes
    lengths: tuple[int, ...]     # the values this state uses: blocks start .. start+len-1
    # A framed segment (frames.py): its whole frame table, where the frames start, and
    # lengths are the used blocks' raw page bytes. Empty for a segment of LMDB values.
    frames: tuple = ()
    at: int = 0
    tensor: str = ""             # a block's tensor (frames.tensor_of)

    @property
    def framed(self) -> bool:
        return bool(self.frames)

    @property
    def used(self) -> int:
        return len(self.lengths)

    def frame_spans(self) -> list[tuple[int, int, int]]:
        """Each frame's (first block in the object, offset, stored bytes)."""
        out, at, b = [], self.at, 0
        for f in self.frames:
            out.append((b, at, f.stored))
            at += f.stored
            b += f.blocks
        return out

    def offsets(self) -> list[int]:
        """Where each used block's value starts in the object (segment of LMDB values)."""
        out, at = [], header_bytes(self.count)
        for n in self.lengths:
            out.append(at)
            at += n
        return out


@dataclass
class StateHead:
    key: bytes
    parent: bytes
    position: int
    tokens: list[int]            # the tail after block d-1
    role: str
    plain: bool
    fingerprint: str
    logical_bytes: int           # the snapshot's tensors
    block_bytes: int             # one block's tensors
    segments: list[SegmentRef]
    snapshot_at: int = 0         # where the snapshot's value starts (set when read)
    tensor: str = ""             # a block's tensor in framed segments (frames.tensor_of)

    @property
    def blocks(self) -> int:
        return sum(s.used for s in self.segments)


def pack(head: StateHead, snapshot: bytes | memoryview, relative) -> bytes:
    """relative(name): a segment's name as the head keeps it."""
    segs = [[relative(s.name), s.start, s.count, s.size, s.used, _frames_text(s.frames), s.at]
            if s.framed else
            [relative(s.name), s.start, s.count, s.size,
             base64.b64encode(np.asarray(s.lengths, "<u4").tobytes()).decode()]
            for s in head.segments]
    doc = {"key": head.key.hex(), "parent": head.parent.hex(), "position": head.position,
           "tokens": head.tokens, "role": head.role, "plain": head.plain,
           "fp": head.fingerprint, "logical_bytes": head.logical_bytes,
           "block_bytes": head.block_bytes, "segments": segs}
    if head.tensor:
        doc["tensor"] = head.tensor
    body = zstandard.ZstdCompressor(level=3).compress(
        json.dumps(doc, separators=(",", ":")).encode())
    frame = _HEAD.pack(MAGIC, len(body)) + body
    return b"".join([frame, xxhash.xxh3_64_digest(frame), snapshot])


def head_bytes(buf: bytes | memoryview) -> int:
    """How many bytes of the object the head takes (from its first 8)."""
    if len(buf) < _HEAD.size:
        raise codec.CorruptValue("state object too short")
    magic, n = _HEAD.unpack_from(buf, 0)
    if magic != MAGIC:
        raise codec.CorruptValue("not a state object")
    return _HEAD.size + n + _SUM


def read_head(buf: bytes | memoryview, fingerprint: str, absolute) -> StateHead:
    """The head at the start of buf (at least head_bytes(buf) of it), checked: checksum,
    model, segments that cover blocks 0.. without a gap. absolute(relative name): the
    object's full name. codec.CorruptValue when anything is off."""
    mv = memoryview(buf)
    end = head_bytes(mv)
    if len(mv) < end:
        raise codec.CorruptValue("state head cut short")
    if xxhash.xxh3_64_digest(mv[:end - _SUM]) != mv[end - _SUM:end]:
        raise codec.CorruptValue("state head checksum mismatch")
    try:
        d = json.loads(zstandard.ZstdDecompressor().decompress(
            bytes(mv[_HEAD.size:end - _SUM]), max_output_size=64 << 20))
        segs = [_segment_ref(s, absolute, int(d["block_bytes"]), str(d.get("tensor", "")))
                for s in d["segments"]]
        head = StateHead(bytes.fromhex(d["key"]), bytes.fromhex(d["parent"]), d["position"],
                         d["tokens"], d["role"], d["plain"], d["fp"], d["logical_bytes"],
                         d["block_bytes"], segs, end, str(d.get("tensor", "")))
    except (ValueError, KeyError, TypeError, zstandard.ZstdError) as e:
        raise codec.CorruptValue(f"bad state head: {e}") from None
    if head.fingerprint != fingerprint:
        raise codec.CorruptValue(f"state of model {head.fingerprint!r}, expected {fingerprint!r}")
    at = 0
    for s in segs:
        if s.start != at or not 0 < s.used <= s.count or (
                s.size != s.at + sum(f.stored for f in s.frames) if s.framed
                else s.size < header_bytes(s.count) + sum(s.lengths)):
            raise codec.CorruptValue("a state's segments leave a gap or overrun")
        at += s.used
    if not (isinstance(head.position, int) and head.position > 0
            and isinstance(head.tokens, list) and head.role in ROLES
            and len(head.key) == len(head.parent) == 16):
        raise codec.CorruptValue("a state head field is out of range")
    return head


def _segment_ref(row: list, absolute, block_bytes: int, tensor: str) -> SegmentRef:
    """A head's row of one segment: 5 fields for a segment of LMDB values, 7 framed."""
    if len(row) == 5:
        rel, start, count, size, lengths = row
        raw = base64.b64decode(lengths, validate=True)
        return SegmentRef(absolute(rel), int(start), int(count), int(size),
                          tuple(int(n) for n in np.frombuffer(raw, "<u4")))
    rel, start, count, size, used, text, at = row
    table = np.frombuffer(base64.b64decode(text, validate=True), _FRAME_ROW)
    frames = tuple(Frame(int(b), int(n), int(c)) for b, n, c in table.tolist())
    if sum(f.blocks for f in frames) != int(count) or not frames or min(
            f.blocks for f in frames) < 1:
        raise ValueError("a frame table that does not hold its segment's blocks")
    return SegmentRef(absolute(rel), int(start), int(count), int(size),
                      (block_bytes,) * int(used), frames, int(at), tensor)


def _frames_text(frames) -> str:
    return base64.b64encode(np.asarray([tuple(f) for f in frames], _FRAME_ROW).tobytes()
                            ).decode()


def fetch_head(get_range, name: str, size: int | None, fingerprint: str, absolute
               ) -> StateHead | None:
    """A state object's head read with get_range(name, start, end) (one ranged GET, two
    for a long head); None when the object is gone, codec.CorruptValue when it is bad.
    size: the object's, when a LIST gave it."""
    got = get_range(name, 0, FIRST_READ if size is None else min(size, FIRST_READ))
    if got is None:
        return None
    data = got[0]
    need = head_bytes(data)
    if need > len(data):
        more = get_range(name, len(data), need)
        data += more[0] if more else b""
    return read_head(data, fingerprint, absolute)

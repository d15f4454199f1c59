"""A framed segment: consecutive blocks of one chain as their pages' raw bytes, cut into
frames of ~512 KiB, each one zstd frame with one checksum.

    "CKPF" ‖ u32 count ‖ u64 first block ‖ start parent (16) ‖ u32 block bytes
    ‖ u32 frames ‖ u16 tensor length ‖ tensor ("float16 2x16x3x64") ‖ count x key (16)
    ‖ frames x (u32 blocks ‖ u32 stored bytes ‖ xxh3-64 of the stored bytes)
    ‖ xxh3-64 of the bytes before it ‖ the frames, end to end

A frame holds ~512 KiB of pages (RemoteConfig.frame_bytes; a reader takes any). A
block is its page's tensor (dtype and shape as the header's tensor names them) in
little-endian bytes, `block bytes` long; a frame is the zstd frame of the bytes of its
blocks laid end to end. So a restore checks and decompresses once per ~512 KiB of pages,
straight into the pool pages the frame covers, instead of once per ~4 KiB block value
(segment.py: each value an LMDB value with its own checksum and header, ~25 us apiece
decoded, most of a restore's CPU). The frame table (each frame's blocks, stored size and
checksum) is copied into every state head that names the segment (state.py), so a
reader reads frames without this header; the header serves whoever has no state
(verify, an uploader finding the segment there, gc).

Framed objects are named with a ".f" after the name of the old layout's object
(layout.py), so a daemon of the old layout never lists them (it would take a framed
head for a damaged one and delete it), and a daemon of this one reads both.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

import torch
import xxhash
import zstandard

from ckptd.cache import codec, codec_batch
from ckptd.cache.keys import KEY_BYTES

MAGIC = b"CKPF"
LEVEL = 1                    # zstd level: a restore's decompression is what counts
_WORTH = 1.1                 # a frame is compressed when that makes it this much smaller
_RAW_LEVEL = -1             # a zstd level that stores a frame as raw blocks
_HEAD = struct.Struct("<4sIQ16sIIH")       # magic, count, first, parent, block bytes,
                                           # frames, tensor length
_FRAME = struct.Struct("<IIQ")             # blocks, stored bytes, xxh3-64
_SUM = 8


class Frame(NamedTuple):
    """One frame of a segment."""
    blocks: int
    stored: int              # its bytes in the object
    checksum: int            # xxh3-64 of those bytes


def tensor_of(dtype: torch.dtype, shape) -> str:
    """How a header names a block's tensor: its dtype and shape."""
    return f"{str(dtype).removeprefix('torch.')} {'x'.join(str(n) for n in shape)}"


def frame_blocks(frame_bytes: int, block_bytes: int) -> int:
    """Blocks a frame of frame_bytes holds (one at least)."""
    return max(1, frame_bytes // max(1, block_bytes))


@dataclass(frozen=True)
class FramedHeader:
    start: int
    parent: bytes
    block_bytes: int
    tensor: str
    keys: tuple[bytes, ...]
    frames: tuple[Frame, ...]

    @property
    def header_bytes(self) -> int:
        return header_bytes(len(self.keys), len(self.frames), len(self.tensor.encode()))

    @property
    def size(self) -> int:
        return self.header_bytes + sum(f.stored for f in self.frames)


def header_bytes(count: int, frames: int, tensor_len: int) -> int:
    return _HEAD.size + tensor_len + count * KEY_BYTES + frames * _FRAME.size + _SUM


def max_header_bytes(count: int) -> int:
    """Bytes that hold the header of any framed segment of `count` blocks (a frame
    holds one block at least; a tensor's name is short)."""
    return header_bytes(count, count, 256)


def pack(start: int, parent: bytes, keys: list[bytes], pages: list, tensor: str,
         block_bytes: int, frame_bytes: int) -> tuple[bytes, FramedHeader]:
    """The object holding blocks start .. start + len(keys) - 1 of a chain: keys and
    each block's raw page bytes (a buffer of block_bytes each), in chain order, in
    frames of frame_bytes."""
    if not keys or len(parent) != KEY_BYTES or len(keys) != len(pages):
        raise ValueError("a segment holds at least one block after a 16-byte parent key")
    if any(len(memoryview(p).cast("B")) != block_bytes for p in pages):
        raise ValueError(f"a block's page is not {block_bytes} bytes")
    per = frame_blocks(frame_bytes, block_bytes)
    # a compressor of its own: one is not safe to share between threads (the uploader
    # packs segments on several at once; a shared one crashed a daemon)
    cctx, raw_cctx = zstandard.ZstdCompressor(level=LEVEL), None
    frames, bodies = [], []
    for lo in range(0, len(pages), per):
        raw = b"".join(pages[lo:lo + per])
        body = cctx.compress(raw)
        if len(body) * _WORTH > len(raw):
            # Saving under ~10%: the frame's blocks are stored as they are (a zstd frame
            # still, of raw blocks). A restore is CPU-bound on two cores: decompressing
            # a 512 KiB frame of the tiny model's fp32 KV took 0.74 ms for 8% fewer
            # bytes; a frame of raw blocks, 0.03 ms (docs/BENCHMARKS.md, issue 32).
            raw_cctx = raw_cctx or zstandard.ZstdCompressor(level=_RAW_LEVEL)
            body = raw_cctx.compress(raw)
        bodies.append(body)
        frames.append(Frame(min(per, len(pages) - lo), len(body), xxhash.xxh3_64_intdigest(body)))
    name = tensor.encode()
    head = b"".join([_HEAD.pack(MAGIC, len(keys), start, parent, block_bytes, len(frames),
                                len(name)), name, *keys,
                     *(_FRAME.pack(*f) for f in frames)])
    body = b"".join([head, xxhash.xxh3_64_digest(head), *bodies])
    return body, FramedHeader(start, parent, block_bytes, tensor, tuple(keys), tuple(frames))


def read_header(buf: bytes | memoryview) -> FramedHeader:
    """The header at the start of buf (which may hold only the header); codec.CorruptValue
    when it is damaged, cut short, or not a framed segment's."""
    mv = memoryview(buf)
    if len(mv) < _HEAD.size:
        raise codec.CorruptValue("segment too short")
    magic, count, start, parent, block_bytes, n, tlen = _HEAD.unpack_from(mv, 0)
    if magic != MAGIC or count < 1 or not 1 <= n <= count:
        raise codec.CorruptValue("not a framed segment header")
    end = header_bytes(count, n, tlen) - _SUM
    if len(mv) < end + _SUM:
        raise codec.CorruptValue("framed segment header cut short")
    if xxhash.xxh3_64_digest(mv[:end]) != mv[end:end + _SUM]:
        raise codec.CorruptValue("segment header checksum mismatch")
    at = _HEAD.size + tlen
    tensor = bytes(mv[_HEAD.size:at]).decode("utf-8", "replace")
    keys = tuple(bytes(mv[at + i * KEY_BYTES:at + (i + 1) * KEY_BYTES]) for i in range(count))
    at += count * KEY_BYTES
    frames = tuple(Frame(*_FRAME.unpack_from(mv, at + i * _FRAME.size)) for i in range(n))
    if sum(f.blocks for f in frames) != count:
        raise codec.CorruptValue("a framed segment's frames do not hold its blocks")
    return FramedHeader(start, bytes(parent), block_bytes, tensor, keys, frames)


def frame_bodies(buf: bytes | memoryview, header: FramedHeader) -> list[memoryview]:
    """Each frame's stored bytes in a whole object."""
    mv, at, out = memoryview(buf), header.header_bytes, []
    if len(mv) != header.size:
        raise codec.CorruptValue(f"segment of {len(mv)} bytes, its header says {header.size}")
    for f in header.frames:
        out.append(mv[at:at + f.stored])
        at += f.stored
    return out


def check(body: memoryview | bytes, frame: Frame) -> None:
    """codec.CorruptValue unless body is the frame's stored bytes."""
    if len(body) != frame.stored or xxhash.xxh3_64_intdigest(body) != frame.checksum:
        raise codec.CorruptValue("frame checksum mismatch")


def unpack(body: memoryview | bytes, frame: Frame, block_bytes: int) -> bytearray:
    """A checked frame's raw bytes (its blocks' pages end to end), in memory of its own."""
    check(body, frame)
    out = bytearray(frame.blocks * block_bytes)
    _decompress_into(body, memoryview(out))
    return out


def _decompress_into(body: memoryview | bytes, out: memoryview) -> None:
    """One zstd frame into exactly out; codec.CorruptValue when it is not that long."""
    reader = codec._decompressor().stream_reader(body, read_size=len(body))
    got = 0
    try:
        while got < len(out):
            more = reader.readinto(out[got:])
            if not more:
                break
            got += more
        extra = reader.read(1)
    except zstandard.ZstdError as e:
        raise codec.CorruptValue(f"undecodable frame: {e}") from None
    if got != len(out) or extra:
        raise codec.CorruptValue(f"a frame of {got} bytes or more, {len(out)} expected")


def into_pages(body: memoryview | bytes, frame: Frame, block_bytes: int,
               dest: memoryview | torch.Tensor | dict[int, torch.Tensor]) -> None:
    """Check a frame and write its blocks into their pages: dest is the memory of all
    of them end to end (run_view; the decompressor writes straight into it), all of
    them as one [blocks, *kv_shape] tensor (any strides: one copy), or block index in
    the frame -> a page ([*kv_shape] tensor, any strides; the frame is then
    decompressed once and each page copied). codec.CorruptValue when the frame is bad:
    a checksum that fails writes nothing; a frame that passes it and still does not
    decompress to its size (a writer's bug) may have written some of its pages, which
    a failed restore never serves."""
    check(body, frame)
    if isinstance(dest, memoryview):
        if len(dest) != frame.blocks * block_bytes:
            raise ValueError(f"a run of {len(dest)} bytes for a frame of {frame.blocks} pages")
        _decompress_into(body, dest)
        return
    raw = bytearray(frame.blocks * block_bytes)
    _decompress_into(body, memoryview(raw))
    if isinstance(dest, torch.Tensor):
        if dest.shape[0] != frame.blocks or dest[0].numel() * dest.element_size() != block_bytes:
            raise ValueError(f"pages {list(dest.shape)} for a frame of {frame.blocks} pages")
        dest.copy_(torch.frombuffer(raw, dtype=torch.uint8).view(dest.dtype).view(dest.shape))
        return
    first = next(iter(dest.values()))
    src = torch.frombuffer(raw, dtype=torch.uint8).view(first.dtype).view(
        frame.blocks, *first.shape)
    js = sorted(dest)
    torch._foreach_copy_([dest[j] for j in js], [src[j] for j in js])


def addresses(pages) -> list[int]:
    """Where each page's bytes start, when a frame can be decompressed straight into it
    (a contiguous CPU page, little-endian host); else -1. pages: [*kv_shape] tensors,
    or pool pages that know their addresses (cache/page_views.py: PoolPages)."""
    if codec._BIG:
        return [-1] * len(pages)
    if hasattr(pages, "addresses"):
        return pages.addresses()
    if any(p.device.type != "cpu" for p in pages[:1]):
        return [-1] * len(pages)
    return [p.data_ptr() if p.is_contiguous() and p.device.type == "cpu" else -1
            for p in pages]


def run_view(first: torch.Tensor, nbytes: int) -> memoryview:
    """nbytes of memory from the start of page `first` on, writable: pages that lie end
    to end after it (addresses() says which do), as one buffer."""
    flat = torch.empty(0, dtype=torch.uint8).set_(
        first.untyped_storage(), first.storage_offset() * first.element_size(), (nbytes,))
    return memoryview(flat.numpy()).cast("B")


def page_bytes(t: torch.Tensor) -> memoryview:
    """A page's raw little-endian bytes, as a frame holds them."""
    return memoryview(codec._le_bytes(t)).cast("B")


def as_tensor(raw: bytearray | memoryview, dtype: torch.dtype, shape) -> torch.Tensor:
    """A block's raw bytes (writable memory) as its page tensor: a view, no copy."""
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).view(*shape)


def cut_values(items: list, block_bytes: int, spec, fingerprint: str) -> list:
    """LMDB values of blocks read in frames: items (key, meta, the frame's stored bytes,
    Frame, index in it), in chain order -> (key, meta, value, None), each frame
    decompressed once and its blocks encoded together (codec_batch.encode_pages). A
    frame that fails now (it was checked when read) ends the list there."""
    out, at = [], 0
    while at < len(items):
        body, frame = items[at][2], items[at][3]
        run = at
        while run < len(items) and items[run][2] is body:
            run += 1
        group, at = items[at:run], run
        try:
            raw = unpack(body, frame, block_bytes)
        except codec.CorruptValue:
            break
        pages = as_tensor(raw, spec.kv_dtype, (frame.blocks, *spec.kv_shape()))
        js = [j for *_, j in group]
        chosen = pages if js == list(range(frame.blocks)) else pages[js]
        for (key, meta, *_), blob in zip(group, codec_batch.encode_pages(
                chosen, fingerprint, [key for key, *_ in group])):
            meta.stored_bytes = len(blob)
            out.append((key, meta, blob, None))
    return out


def blocks_of(raw: bytes | bytearray | memoryview, blocks: int, block_bytes: int
              ) -> list[memoryview]:
    """The pages of a frame's raw bytes."""
    mv = memoryview(raw)
    return [mv[j * block_bytes:(j + 1) * block_bytes] for j in range(blocks)]

"""Damaging one block's bytes in a segment object, as tests of corrupt remotes do."""

from __future__ import annotations

from ckptd.cache.remote import frames, segment


def flip_block(body: bytearray, index: int, bit: int = 0x01) -> int:
    """Flip one bit in the middle of block `index`'s bytes (its index in the segment):
    its frame's stored bytes in a framed segment, its value in one of LMDB values.
    Returns the first block the damage takes (a frame's first block, or index)."""
    if bytes(body[:4]) == frames.MAGIC:
        h = frames.read_header(body)
        at, first = h.header_bytes, 0
        for f in h.frames:
            if first + f.blocks > index:
                body[at + f.stored // 2] ^= bit
                return first
            at, first = at + f.stored, first + f.blocks
        raise IndexError(index)
    h = segment.read_header(body)
    at = h.header_bytes + sum(h.lengths[:index])
    body[at + h.lengths[index] // 2] ^= bit
    return index

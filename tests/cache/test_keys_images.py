"""Keys of prompts with images: an image's digest, grid and offset in the extras of the
block it starts in, exactly as cache/keys.py documents them."""

from __future__ import annotations

import hashlib
import struct

from ckptd.cache.keys import KeyChain, KeyContext, encode_tokens, root_key, snapshot_key
from ckptd.model.vision.positions import ImageSpan

B = 8
ROOT = root_key("fp", B)


def _ctx(*images):
    return KeyContext(media=tuple(images), block_size=B)


def _image(start, digest=b"a", grid=(1, 4, 6)):
    return ImageSpan(start, grid, 2, hashlib.blake2b(digest, digest_size=32).digest())


def test_block_bytes_are_the_documented_ones():
    im = _image(11)
    tokens = list(range(40))
    keys = KeyChain(ROOT, B, tokens, _ctx(im)).keys
    plain = KeyChain(ROOT, B, tokens).keys
    assert keys[0] == plain[0]                     # text before the image: a plain prefix
    h = lambda *p: hashlib.blake2b(b"".join(p), digest_size=16).digest()  # noqa: E731
    extra = b"img" + struct.pack("<IIIII", 3, 1, 4, 6, 2) + im.digest
    want = h(b"\x01", keys[0], encode_tokens(tokens[8:16]), b"\x00",
             struct.pack("<I", len(extra)), extra)
    assert keys[1] == want
    assert keys[2] != plain[2]                     # after it: the chain differs


def test_other_pixels_other_keys_same_pixels_same_keys():
    tokens = [5] * 48
    a = KeyChain(ROOT, B, tokens, _ctx(_image(10, b"a"))).keys
    b = KeyChain(ROOT, B, tokens, _ctx(_image(10, b"b"))).keys
    again = KeyChain(ROOT, B, tokens, _ctx(_image(10, b"a"))).keys
    moved = KeyChain(ROOT, B, tokens, _ctx(_image(11, b"a"))).keys
    shaped = KeyChain(ROOT, B, tokens, _ctx(_image(10, b"a", (1, 6, 4)))).keys
    assert a == again
    assert a[0] == b[0] and a[1] != b[1] and a[1] != moved[1] and a[1] != shaped[1]


def test_snapshot_keys_take_only_the_images_before_them():
    tokens = list(range(20))
    later = _ctx(_image(21, b"x"))         # starts after the snapshot, in its block
    other = _ctx(_image(22, b"y"))
    none = KeyContext()
    parent = KeyChain(ROOT, B, tokens[:16]).keys[1]
    tail = tokens[16:20]
    assert snapshot_key(parent, tail, 2, B, later) == snapshot_key(parent, tail, 2, B, other) \
        == snapshot_key(parent, tail, 2, B, none)
    before = _ctx(_image(17, b"x", (1, 2, 2)))   # one token, inside the tail
    assert snapshot_key(parent, tail, 2, B, before) != snapshot_key(parent, tail, 2, B, none)


def test_positions_and_plain_blocks():
    im = _image(10, grid=(1, 4, 6))       # 6 tokens, advance max(2, 3) = 3
    ctx = _ctx(im)
    assert ctx.next_position(10) == 10 and ctx.next_position(16) == 13
    assert ctx.next_position(30) == 27
    assert ctx.inside_image(12) and not ctx.inside_image(10) and not ctx.inside_image(16)
    assert ctx.plain(0, B) and not ctx.plain(1, B) and ctx.plain(2, B)

"""Prefix keys: one byte encoding, chained, namespaced by model, format, block size, salt."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

from ckptd.cache.keys import (
    FORMAT_VERSION,
    KEY_BYTES,
    KeyContext,
    block_keys,
    decode_tokens,
    encode_tokens,
    key_from_hex,
    root_key,
    snapshot_key,
)


def test_token_encoding_is_little_endian_uint32():
    assert encode_tokens([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    assert decode_tokens(encode_tokens([5, 2 ** 32 - 1])) == [5, 2 ** 32 - 1]
    for bad in ([-1], [2 ** 32], [3, -5]):
        with pytest.raises(ValueError, match="uint32"):
            encode_tokens(bad)
    # lists take array.array's path, arrays and tuples numpy's: the same bytes
    ids = [0, 1, 255, 256, 65535, 65536, 49151, 2 ** 31, 2 ** 32 - 1] * 50
    assert encode_tokens(ids) == encode_tokens(tuple(ids)) == encode_tokens(np.array(ids))


def test_keys_follow_the_documented_bytes():
    # Rebuilt from the encoding in cache/keys.py's docstring with hashlib alone. Changing
    # these bytes invalidates every store on disk: bump FORMAT_VERSION when you must.
    def h(*parts):
        return hashlib.blake2b(b"".join(parts), digest_size=16).digest()
    u32 = lambda n: struct.pack("<I", n)  # noqa: E731
    root = h(b"\x00", b"ckptd", u32(2), b"fp", u32(FORMAT_VERSION), u32(4), u32(4), b"salt")
    assert root_key("fp", 4, "salt") == root == root_key("fp", 4, b"salt")
    block = h(b"\x01", root, encode_tokens([1, 2, 3, 4]), b"\x00", u32(0))
    assert block_keys(root, [1, 2, 3, 4], 4) == [block]
    snap = h(b"\x02", root, encode_tokens([7]), b"\x00", u32(0))
    assert snapshot_key(root, [7], 0, 4) == snap
    assert root.hex() == "66bd20cd28cef0b89e189a969cfec0d4"          # format 2; and stays so


def test_chain_prefixes_and_namespaces():
    toks = list(range(40))
    r = root_key("fp", 8)
    k = block_keys(r, toks, 8)
    assert len(k) == 5 and len(set(k)) == 5 and all(len(x) == KEY_BYTES for x in k)
    assert block_keys(r, toks[:17], 8) == k[:2]              # a prefix's keys are a prefix
    assert block_keys(r, [99] + toks[1:], 8)[4] != k[4]      # an early change moves all keys
    for other in (root_key("fp", 8, "tenant"), root_key("fp2", 8), root_key("fp", 16)):
        assert block_keys(other, toks, 8)[0] != k[0]
    # length prefixes: fingerprint/salt boundaries can't be shifted to collide
    assert root_key("ab", 8, "c") != root_key("a", 8, "bc")


def test_positions_only_count_where_they_are_not_linear():
    toks = list(range(24))
    r = root_key("fp", 8)
    plain = block_keys(r, toks, 8)
    assert block_keys(r, toks, 8, KeyContext(positions=list(range(24)))) == plain
    mrope = list(range(8)) + [8] * 8 + list(range(9, 17))     # an image in block 1
    shifted = block_keys(r, toks, 8, KeyContext(positions=mrope))
    assert shifted[0] == plain[0] and shifted[1] != plain[1] and shifted[2] != plain[2]
    with pytest.raises(ValueError, match="positions"):
        block_keys(r, toks, 8, KeyContext(positions=[0, 1]))


def test_extras_belong_to_their_block():
    toks = list(range(24))
    r = root_key("fp", 8)
    plain = block_keys(r, toks, 8)
    img = block_keys(r, toks, 8, KeyContext(extras=[b"", b"image-hash"]))
    assert img[0] == plain[0] and img[1] != plain[1]
    other = block_keys(r, toks, 8, KeyContext(extras=[b"", b"other-image"]))
    assert other[1] != img[1]


def test_snapshot_keys_cover_tail_and_context():
    r = root_key("fp", 4)
    k = block_keys(r, list(range(8)), 4)
    a = snapshot_key(k[1], [8, 9], 2, 4)
    assert a != snapshot_key(k[1], [8, 10], 2, 4)
    assert a != snapshot_key(k[0], [8, 9], 2, 4)
    assert snapshot_key(k[1], [], 2, 4) != snapshot_key(k[1], [8], 2, 4)
    assert a != snapshot_key(k[1], [8, 9], 2, 4, KeyContext(extras=[b"", b"", b"img"]))
    with pytest.raises(ValueError, match="shorter than a block"):
        snapshot_key(k[1], [1, 2, 3, 4], 2, 4)


def test_hex_round_trip_and_bad_keys():
    k = root_key("fp", 4)
    assert key_from_hex(k.hex()) == k
    for bad in ("xyz", "00", k.hex() + "00", ""):
        with pytest.raises(ValueError, match="key"):
            key_from_hex(bad)


def _chain(root, tokens, B, ctx=None):
    """Block keys hashed one by one from the documented bytes, bypassing any reuse."""
    ctx = ctx or KeyContext()
    data, keys, k = encode_tokens(tokens), [], root
    for i in range(len(tokens) // B):
        k = hashlib.blake2b(b"\x01" + k + data[4 * i * B:4 * (i + 1) * B]
                            + ctx.positions_part(i * B, (i + 1) * B) + ctx.extra(i),
                            digest_size=16).digest()
        keys.append(k)
    return keys


def test_reused_keys_equal_fresh_ones():
    # block_keys reuses the keys of recent runs sharing a prefix; every answer must be
    # the chain hashed afresh, whatever was asked before it
    r, r2 = root_key("fp", 4), root_key("fp", 4, "tenant")
    base = list(range(100, 180))
    asks = [(r, base, 4), (r, base + [1, 2, 3, 4, 5], 4), (r, base[:37], 4),
            (r, base[:40] + [9] * 12, 4), (r, base[:41] + [9] * 12, 4), (r2, base, 4),
            (r, base, 8), (r, [7] * 3, 4), (r, base[:20] + [1] + base[21:], 4)]
    for root, toks, B in asks + asks[::-1]:
        got = block_keys(root, toks, B)
        assert got == _chain(root, toks, B)
        got.append(b"caller's own")                 # the caller may change its list
        assert block_keys(root, toks, B) == _chain(root, toks, B)
    shifted = KeyContext(positions=list(range(5, 85)))   # not reused: positions differ
    assert block_keys(r, base, 4, shifted) == _chain(r, base, 4, shifted) != _chain(r, base, 4)

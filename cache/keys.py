"""Content keys for cached state: the one place their bytes are defined.

Byte encoding:
    tokens     little-endian uint32 per token
    positions  little-endian int64 per token of a block, only when that block's
               positions are not the linear iB .. iB+n-1 (M-RoPE images, shifted text)
    extras     u32 little-endian length ‖ bytes (image / embedding hashes of the block)
    H          blake2b with a 16-byte digest; its first input byte is a domain tag

    k_0 = H(0x00 ‖ "ckptd" ‖ u32 len(fp) ‖ fp ‖ u32 format ‖ u32 block_size ‖ u32 len(salt) ‖ salt)
    k_i = H(0x01 ‖ k_{i-1} ‖ tokens[(i-1)B : iB] ‖ (0x01 ‖ positions | 0x00) ‖ extras[i-1])
    snapshot at P = dB + r (0 <= r < B):
          H(0x02 ‖ k_d ‖ tokens[dB : P] ‖ (0x01 ‖ positions | 0x00) ‖ extras[d])

`extras` is a per-block list: extras[i] belongs to block i (the tokens
[iB, (i+1)B)); a missing or empty entry means none, so text before an image
shares its keys with a text-only prompt. Keys are bytes; `hex()` and
`key_from_hex` round-trip them for APIs and tools.

Images (`media`: the spans of a sequence's images, model/vision/positions.py) add to
the extras of the block each one starts in:

    "img" ‖ u32 offset in the block ‖ u32 t, h, w (patches) ‖ u32 merge ‖ digest (32 B)

in order of their starts. The digest names the decoded pixels, the grid and the
encoder; the grid and the offset fix every later M-RoPE position, so the chain needs no
positions. A snapshot's key takes only the images that start before its position (a
state is never inside an image: model/vision, cache/manager.py), so a later image in
the same block does not hide it from a prompt that parts there.
"""

from __future__ import annotations

import array
import hashlib
import struct
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

FORMAT_VERSION = 2                  # 2: codec.plane32 (older builds cannot read it)
KEY_BYTES = 16


def _h(tag: int, *parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    h.update(bytes([tag]))
    for p in parts:
        h.update(p)
    return h.digest()


def _lp(data: bytes) -> bytes:
    """Length-prefixed, so that concatenated fields can't be confused."""
    return struct.pack("<I", len(data)) + data


def encode_tokens(tokens: Sequence[int] | np.ndarray) -> bytes:
    if isinstance(tokens, list) and _NATIVE_U32:
        # array.array reads a list of ints faster than numpy (docs/BENCHMARKS.md,
        # Measurements behind the code), and a request encodes its whole prompt a few times
        try:
            return array.array("I", tokens).tobytes()
        except (OverflowError, TypeError):
            pass                            # negative, too large or not ints: numpy says
    arr = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if arr.size and (arr.min() < 0 or arr.max() >= 2 ** 32):
        raise ValueError("token ids must fit in uint32")
    return arr.astype("<u4").tobytes()


_NATIVE_U32 = array.array("I").itemsize == 4 and sys.byteorder == "little"


def decode_tokens(data: bytes) -> list[int]:
    return np.frombuffer(data, dtype="<u4").astype(np.int64).tolist()


def key_from_hex(text: str) -> bytes:
    """Parse a key given by a user (HTTP path, CLI); ValueError when it is not one."""
    try:
        key = bytes.fromhex(text)
    except (ValueError, TypeError):
        raise ValueError(f"not a cache key: {text!r}") from None
    if len(key) != KEY_BYTES:
        raise ValueError(f"a cache key is {2 * KEY_BYTES} hex digits, got {len(text)}")
    return key


_NO_EXTRA = _lp(b"")


def root_key(fingerprint: str, block_size: int, salt: str | bytes | None = None) -> bytes:
    salt_b = salt.encode() if isinstance(salt, str) else (salt or b"")
    return _h(0, b"ckptd", _lp(fingerprint.encode()),
              struct.pack("<II", FORMAT_VERSION, block_size), _lp(salt_b))


@dataclass(frozen=True)
class KeyContext:
    """What besides the tokens names a prefix: tenant salt, per-block extras, positions."""

    salt: str | bytes | None = None
    extras: Sequence[bytes] | None = None
    positions: Sequence[int] | np.ndarray | None = None
    media: tuple = ()              # image spans (start, length, grid, merge, digest, ...)
    block_size: int = 0            # needed with media: which block an image starts in

    def extra(self, i: int, upto: int | None = None) -> bytes:
        """Block i's extras; with `upto`, only the images starting before that offset
        in the block (a snapshot's tail)."""
        e = self.extras
        given = bytes(e[i]) if e is not None and i < len(e) and e[i] else b""
        images = self._images(i, upto) if self.media else b""
        return _lp(given + images) if given or images else _NO_EXTRA

    def _images(self, i: int, upto: int | None) -> bytes:
        B = self.block_size
        if B <= 0:
            raise ValueError("a key context with images needs its block size")
        out = []
        for im in self.media:
            off = im.start - i * B
            if 0 <= off < (B if upto is None else upto):
                out.append(b"img" + struct.pack("<IIIII", off, *im.grid, im.merge)
                           + bytes(im.digest))
        return b"".join(out)

    def plain(self, depth: int, block_size: int) -> bool:
        """True when block `depth` has no extras, no image tokens and linear positions:
        its tokens alone define its state, so a stored page may be cut to the prefix
        that matches."""
        start = depth * block_size
        if any(im.start < start + block_size and im.end > start for im in self.media):
            return False
        n = len(self.positions) if self.positions is not None else 0
        return self.extra(depth) == _NO_EXTRA and (
            n <= start or self.positions_part(start, min(n, start + block_size)) == b"\x00")

    def next_position(self, index: int) -> int:
        """The M-RoPE position a text token at `index` takes (index itself without
        images): what a snapshot there records besides its token count."""
        return index + sum(im.advance - im.length for im in self.media if im.end <= index)

    def inside_image(self, index: int) -> bool:
        """Whether `index` falls strictly inside an image (no state is taken there)."""
        return any(im.start < index < im.end for im in self.media)

    def positions_part(self, start: int, stop: int) -> bytes:
        if self.positions is None:
            return b"\x00"
        pos = np.asarray(self.positions[start:stop], dtype=np.int64)
        if len(pos) != stop - start:
            raise ValueError(f"positions cover {len(self.positions)} tokens, need {stop}")
        if np.array_equal(pos, np.arange(start, stop)):
            return b"\x00"
        return b"\x01" + pos.astype("<i8").tobytes()


def prompt_chain(fingerprint: str, block_size: int, tokens: Sequence[int],
                 salt: str | bytes | None = None, extras: Sequence[bytes] | None = None,
                 positions: Sequence[int] | np.ndarray | None = None,
                 media: tuple = ()) -> KeyChain:
    """The block keys of `tokens` under a model and a salt: the one way a prompt's chain
    is built (CacheStore.chain, which the manager's is; the offline inspector, which
    reads the model from the store). media: the spans of the prompt's images."""
    ctx = KeyContext(salt, extras, positions, media=tuple(media), block_size=block_size)
    return KeyChain(root_key(fingerprint, block_size, salt), block_size, tokens, ctx)


def block_keys(root: bytes, tokens: Sequence[int], block_size: int,
               ctx: KeyContext | None = None) -> list[bytes]:
    """Keys of every full block of `tokens`: keys[i] names tokens[: (i+1) * block_size]."""
    return KeyChain(root, block_size, tokens, ctx).keys


class KeyChain:
    """The block keys of one token sequence, each hashed once: keys[i] names
    tokens[:(i+1)B], and `data` holds those blocks' tokens (uint32 LE). A request's
    chain is made once, when it is admitted, sharing the keys of a recent prompt with
    the same start (_RecentKeys); it grows as generated tokens fill blocks, and every
    lookup and put made for the request reads it instead of hashing again."""

    __slots__ = ("root", "block_size", "ctx", "keys", "data")

    def __init__(self, root: bytes, block_size: int, tokens: Sequence[int] = (),
                 ctx: KeyContext | None = None) -> None:
        self.root, self.block_size = root, block_size
        self.ctx = ctx or KeyContext()
        self.keys: list[bytes] = []
        self.data = b""
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.keys)

    def parent(self, depth: int) -> bytes:
        """The key before block `depth`: the root for the first block."""
        return self.keys[depth - 1] if depth else self.root

    def copy(self, max_blocks: int) -> KeyChain:
        """A chain of this one's first max_blocks keys, to grow on its own."""
        out = KeyChain(self.root, self.block_size, (), self.ctx)
        out.keys = self.keys[:max_blocks]
        out.data = self.data[:len(out.keys) * 4 * self.block_size]
        return out

    def extend(self, tokens: Sequence[int], max_blocks: int | None = None) -> None:
        """Hash the full blocks of `tokens` (the whole sequence so far; at most
        max_blocks of them) that the chain does not hold yet."""
        B, have = self.block_size, len(self.keys)
        n = len(tokens) // B if max_blocks is None else min(max_blocks, len(tokens) // B)
        if n <= have:
            return
        ctx = self.ctx
        plain = ctx.extras is None and ctx.positions is None and not ctx.media
        data = self.data + encode_tokens(tokens[have * B:n * B])
        keys = self.keys
        if plain and not have:
            keys = _recent.longest(self.root, B, data)
        start = len(keys)
        _hash_blocks(keys, self.root, data, n, B, ctx)
        _hashed.blocks += n - start
        self.keys, self.data = keys, data
        if plain:
            _recent.add(self.root, B, data, keys)


def _hash_blocks(keys: list[bytes], root: bytes, data: bytes, n: int, B: int,
                 ctx: KeyContext) -> None:
    """Extend keys (the first blocks' of `data`, uint32 LE tokens, under root) to n."""
    w = 4 * B
    k = keys[-1] if keys else root
    for i in range(len(keys), n):
        k = _h(1, k, data[i * w:(i + 1) * w], ctx.positions_part(i * B, (i + 1) * B),
               ctx.extra(i))
        keys.append(k)


def keys_under(chain: KeyChain, root: bytes, n: int, keys: list[bytes] | None = None
               ) -> list[bytes]:
    """The chain's first n block keys as they would be under another root (another
    salt, adapter set or model), extending `keys` (those hashed so far): what a miss
    compares with the entries of other roots. The recent chains are neither read nor
    filled."""
    keys = [] if keys is None else keys
    _hash_blocks(keys, root, chain.data, min(n, len(chain)), chain.block_size, chain.ctx)
    return keys


class _RecentKeys:
    """The block keys of the last few token runs hashed, so that a run sharing a prefix
    with one of them hashes only the rest. One request asks for its prompt's keys several
    times (device pages, the store's plan, the checkpoints), and the questions over one
    long context share all its blocks: a long prompt is a blake2b call per block, each
    time. Only keys of plain blocks (no positions, no extras) are kept."""

    SIZE = 8

    def __init__(self) -> None:
        self.runs: list[tuple[bytes, int, bytes, list[bytes]]] = []   # newest last
        self.lock = threading.Lock()

    def longest(self, root: bytes, block_size: int, data: bytes) -> list[bytes]:
        """A copy of the keys of the longest known run of whole blocks leading `data`."""
        w = 4 * block_size
        best: list[bytes] = []
        with self.lock:
            runs = list(self.runs)
        for r_root, r_bs, r_data, r_keys in runs:
            if r_root != root or r_bs != block_size:
                continue
            if data.startswith(r_data):
                n = len(r_keys)
            else:
                n = _common_blocks(data, r_data, w)
            if n > len(best):
                best = r_keys[:n]
        return best

    def add(self, root: bytes, block_size: int, data: bytes, keys: list[bytes]) -> None:
        run = (root, block_size, data, list(keys))
        with self.lock:
            # a run that leads the new one is covered by it
            self.runs = [r for r in self.runs
                         if not (r[0] == root and r[1] == block_size and data.startswith(r[2]))]
            self.runs.append(run)
            del self.runs[:-self.SIZE]


def _common_blocks(a: bytes, b: bytes, w: int) -> int:
    """How many whole w-byte blocks a and b share from the start."""
    lo, hi = 0, min(len(a), len(b)) // w       # a[:lo*w] == b[:lo*w] holds
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo * w:mid * w] == b[lo * w:mid * w]:   # only what is not known equal
            lo = mid
        else:
            hi = mid - 1
    return lo


_recent = _RecentKeys()


class _Hashed:
    blocks = 0          # block keys hashed by this process


_hashed = _Hashed()


def blocks_hashed() -> int:
    """Block keys hashed so far in this process (tests count hashing per request)."""
    return _hashed.blocks


def snapshot_key(parent: bytes, tail_tokens: Sequence[int], depth: int, block_size: int,
                 ctx: KeyContext | None = None) -> bytes:
    """Key of the state after `parent` (the key of block depth-1, or the root when
    depth = 0) plus `tail_tokens` = tokens[depth*B : P], fewer than B of them."""
    ctx = ctx or KeyContext()
    if len(tail_tokens) >= block_size:
        raise ValueError(f"a snapshot tail is shorter than a block, got {len(tail_tokens)}")
    start = depth * block_size
    return _h(2, parent, encode_tokens(tail_tokens),
              ctx.positions_part(start, start + len(tail_tokens)),
              ctx.extra(depth, len(tail_tokens)))

"""Content keys for cached state.

Byte encoding (the one place it is defined):
    tokens     little-endian uint32 per token
    positions  little-endian int64 per token, only when they are not 0..n-1
    H          blake2b, 16-byte digest, with a one-byte domain tag first

    k_0 = H(0x00 ‖ "ckptd" ‖ fingerprint ‖ format ‖ block_size ‖ salt)
    k_i = H(0x01 ‖ k_{i-1} ‖ tokens[(i-1)B : iB] ‖ positions? ‖ extras)
    snapshot at P = dB + r (0 <= r < B):  H(0x02 ‖ k_d ‖ tokens[dB : P])

Keys are bytes; `hex()` / `bytes.fromhex` round-trip them for APIs and tools.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

FORMAT_VERSION = 1
KEY_BYTES = 16


def _h(tag: int, *parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    h.update(bytes([tag]))
    for p in parts:
        h.update(p)
    return h.digest()


def encode_tokens(tokens) -> bytes:
    arr = np.asarray(tokens, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= 2 ** 32):
        raise ValueError("token ids must fit in uint32")
    return arr.astype("<u4").tobytes()


def decode_tokens(data: bytes) -> list[int]:
    return np.frombuffer(data, dtype="<u4").astype(np.int64).tolist()


def root_key(fingerprint: str, block_size: int, salt: str | bytes | None = None) -> bytes:
    salt_b = salt.encode() if isinstance(salt, str) else (salt or b"")
    return _h(0, b"ckptd", fingerprint.encode(), struct.pack("<II", FORMAT_VERSION, block_size),
              struct.pack("<I", len(salt_b)), salt_b)


def block_keys(root: bytes, tokens, block_size: int, positions=None,
               extras: bytes = b"") -> list[bytes]:
    """Keys of every full block of `tokens`: keys[i] covers tokens[: (i+1) * block_size]."""
    n = len(tokens) // block_size
    data = encode_tokens(tokens[: n * block_size])
    pos = None
    linear = positions is None or np.array_equal(np.asarray(positions), np.arange(len(positions)))
    if not linear:
        pos = np.asarray(positions, dtype="<i8").tobytes()
    keys, k, w = [], root, 4 * block_size
    for i in range(n):
        parts = [k, data[i * w:(i + 1) * w]]
        if pos is not None:
            parts.append(pos[i * 8 * block_size:(i + 1) * 8 * block_size])
        if extras:
            parts.append(extras)
        k = _h(1, *parts)
        keys.append(k)
    return keys


def snapshot_key(parent: bytes, tail_tokens) -> bytes:
    """Key of the state after `parent` (a block key, or the root) plus tail_tokens."""
    return _h(2, parent, encode_tokens(tail_tokens))

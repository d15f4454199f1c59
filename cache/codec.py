"""Serialization of one cached value: named tensors <-> checksummed, compressed bytes.

Layout:
    MAGIC "CKPV" ‖ u16 format version ‖ u32 header length ‖ header (JSON)
    ‖ payload ‖ xxh3-128 of everything before it (16 bytes)

The header names the model fingerprint and, per tensor, its dtype, shape, codec
and payload byte ranges. Tensor bytes are little-endian on every platform.
Codecs:
    plane16  16-bit floats: each value is split into its low and high byte, giving
             two planes. The high plane (sign, exponent, top mantissa bits) is
             zstd-compressed; the low plane is near-random, so it is stored as is
             (measured: the same ratio as compressing both, for half the work).
             Split and merge are shifts on unsigned ints, not strided byte copies.
    plane32  float32 the same way, in four planes; each is zstd-compressed where
             that makes it shorter, else stored as is (so a plane is packed iff
             it is shorter than the tensor's element count). On fp32 KV only the
             top plane packs, and it decodes faster and packs tighter than zstd
             over the whole tensor.
             A plane is all literals to zstd: it has no long repeats, and short
             matches cost ratio and decode time. So planes are compressed with
             matches of 7+ bytes and a tiny match table (_PLANE_ZSTD): a little
             tighter, and faster to decode.
    zstd     other dtypes, when zstd saves bytes;  raw: otherwise.
Lossless always. The checksum is xxh3-128, an order of magnitude faster than blake2b
or crc32, so verifying every read costs almost nothing. (The figures:
docs/BENCHMARKS.md, Measurements behind the code.)
"""

from __future__ import annotations

import json
import struct
import sys
import threading

import numpy as np
import torch
import xxhash
import zstandard

MAGIC = b"CKPV"
VERSION = 2                                       # 2: plane32
_PREFIX = struct.Struct("<4sHI")                  # magic, version, header length
_SUM = 16
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool)}
_UNSIGNED = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}
_BIG = sys.byteorder == "big"
_local = threading.local()          # a decompressor per thread: they are not thread-safe
_PLANE_ZSTD = zstandard.ZstdCompressionParameters.from_level(1, min_match=7, hash_log=8,
                                                             chain_log=6)
_PLANES = {"plane16": 2, "plane32": 4}            # codec -> bytes per element
_KEY_FIELD = b',"key":"'
_HEX = b"0123456789abcdef"
_headers: dict[bytes, dict] = {}                  # header without its key -> parsed
_HEADERS_KEPT = 4096


class CorruptValue(Exception):
    """Bad checksum, bad header, or another format version / model: drop, never serve."""


def _uints(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor's memory as unsigned ints of its width."""
    return t.view(_UNSIGNED[t.element_size()]).numpy()


def _le_bytes(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes in little-endian order, as a flat uint8 array (no copy if possible)."""
    arr = _uints(t.detach().cpu().contiguous()).reshape(-1)
    if _BIG and arr.itemsize > 1:
        arr = arr.byteswap()
    return arr.view(np.uint8)


def encode(tensors: dict[str, torch.Tensor], fingerprint: str, level: int = 1,
           key: bytes | None = None) -> bytes:
    """`key`: the cache key the value is stored under, kept in the checksummed header so
    a read that lands on another entry's (valid) bytes is caught, not served."""
    cctx = zstandard.ZstdCompressor(level=level)
    pctx = None
    entries, parts, offset = [], [], 0
    for name, t in tensors.items():
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise ValueError(f"tensor {name!r}: cannot store dtype {t.dtype}")
        if t.dtype in (torch.float16, torch.bfloat16, torch.float32):
            pctx = pctx or zstandard.ZstdCompressor(compression_params=_PLANE_ZSTD)
            codec, chunks = _split_planes(t, pctx)
        else:
            raw = _le_bytes(t)
            packed = cctx.compress(raw)
            codec, chunks = ("zstd", [packed]) if len(packed) < raw.nbytes else ("raw", [raw])
        sizes = [c.nbytes if isinstance(c, np.ndarray) else len(c) for c in chunks]
        entries.append({"name": name, "dtype": dtype, "shape": list(t.shape), "codec": codec,
                        "offset": offset, "parts": sizes})
        offset += sum(sizes)
        parts += chunks
    head = {"fp": fingerprint, "tensors": entries}
    if key is not None:
        head["key"] = key.hex()
    header = json.dumps(head, separators=(",", ":")).encode()
    body = b"".join([_PREFIX.pack(MAGIC, VERSION, len(header)), header, *parts])
    return body + xxhash.xxh3_128_digest(body)


def _split_planes(t: torch.Tensor, pctx) -> tuple[str, list]:
    """The byte planes of a float tensor, lowest first (see the module docstring)."""
    u = _uints(t.detach().cpu().contiguous()).reshape(-1)
    planes = [(u >> (8 * b)).astype(np.uint8) for b in range(u.itemsize)]  # keeps byte b
    if u.itemsize == 2:
        return "plane16", [planes[0], pctx.compress(planes[1])]
    packed = [pctx.compress(p) for p in planes]
    return "plane32", [c if len(c) < p.nbytes else p for c, p in zip(packed, planes)]


def read_header(blob: bytes | memoryview) -> dict:
    """The header of a value whose checksum was already verified (or for inspection)."""
    if len(blob) < _PREFIX.size + _SUM:
        raise CorruptValue("value too short")
    magic, version, hlen = _PREFIX.unpack_from(blob, 0)
    if magic != MAGIC:
        raise CorruptValue("not a ckptd value")
    if version != VERSION:
        raise CorruptValue(f"format version {version}, this build reads {VERSION}")
    raw = bytes(blob[_PREFIX.size:_PREFIX.size + hlen])
    try:
        header = _parse_header(raw)
    except ValueError:
        raise CorruptValue("bad header") from None
    if not isinstance(header, dict):
        raise CorruptValue("bad header")
    header["payload"] = _PREFIX.size + hlen
    return header


def _parse_header(raw: bytes) -> dict:
    """The header's JSON, parsed. A restore reads thousands of small values whose
    headers differ only in their key (written last) and a compressed plane's size:
    parsing them was a third of decoding a 4 KiB block, so the rest of a header is
    parsed once and kept (what is returned is a copy: the caller may change it)."""
    cut = raw.rfind(_KEY_FIELD)
    keyhex = raw[cut + len(_KEY_FIELD):-2]
    if cut < 0 or not raw.endswith(b'"}') or keyhex.strip(_HEX):
        return json.loads(raw)                           # no key, or not as encode writes it
    rest = raw[:cut] + b"}"
    head = _headers.get(rest)
    if head is None:
        if len(_headers) >= _HEADERS_KEPT:
            _headers.clear()
        head = json.loads(rest)
        if not isinstance(head, dict):
            raise ValueError("header is not an object")
        _headers[rest] = head
    return {**_copy(head), "key": keyhex.decode()}


def _copy(v):
    """A copy of parsed JSON's dicts and lists (its strings and numbers are immutable)."""
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    return [_copy(x) for x in v] if isinstance(v, list) else v


def verify(blob: bytes | memoryview, fingerprint: str | None, key: bytes | None = None) -> dict:
    """Check checksum, format version, model and (when both name one) key; return the
    header. Values written without a key are accepted under any key."""
    mv = memoryview(blob)
    if len(mv) < _PREFIX.size + _SUM:
        raise CorruptValue("value too short")
    if xxhash.xxh3_128_digest(mv[:-_SUM]) != mv[-_SUM:]:
        raise CorruptValue("checksum mismatch")
    header = read_header(mv)
    if fingerprint is not None and header.get("fp") != fingerprint:
        raise CorruptValue(f"value of model {header.get('fp')!r}, expected {fingerprint!r}")
    if key is not None and header.get("key", key.hex()) != key.hex():
        raise CorruptValue(f"value stored for key {header.get('key')}, read for {key.hex()}")
    return header


def describe(blob: bytes | memoryview) -> dict:
    """What a stored value says about itself, for the inspector: format, model, tensors
    and checksum. Never raises on damage: `error` names what is wrong, and the fields
    that could still be read are kept."""
    mv = memoryview(blob)
    out: dict = {"bytes": len(mv), "magic": None, "version": None, "checksum": None,
                 "checksum_ok": False, "fp": None, "tensors": [], "error": None}
    if len(mv) >= _PREFIX.size + _SUM:
        magic, out["version"], _ = _PREFIX.unpack_from(mv, 0)
        out["magic"] = magic.decode("latin-1")
        out["checksum"] = bytes(mv[-_SUM:]).hex()
        out["checksum_ok"] = xxhash.xxh3_128_digest(mv[:-_SUM]) == mv[-_SUM:]
    try:
        header = read_header(mv)
    except CorruptValue as e:
        out["error"] = str(e)
        return out
    out["fp"], out["tensors"] = header.get("fp"), header.get("tensors", [])
    out["header_bytes"] = header["payload"]
    if not out["checksum_ok"]:
        out["error"] = "checksum mismatch"
    return out


def decode(blob: bytes | memoryview, fingerprint: str | None,
           into: dict[str, torch.Tensor] | None = None,
           key: bytes | None = None) -> dict[str, torch.Tensor]:
    """Tensors of a value. `blob` may be a buffer valid only during this call. `into`
    may give contiguous CPU tensors to fill in place (a restore decodes straight into
    its output pages); they must have the stored dtype and shape."""
    header = verify(blob, fingerprint, key)
    mv = memoryview(blob)
    dctx = _decompressor()
    out = {}
    try:
        for e in header["tensors"]:
            out[e["name"]] = _decode_one(mv, header["payload"] + e["offset"], e, dctx,
                                         (into or {}).get(e["name"]))
    except (KeyError, TypeError, zstandard.ZstdError) as err:
        raise CorruptValue(f"undecodable value: {err}") from None
    return out


def _decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor."""
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def _decode_one(mv: memoryview, pos: int, e: dict, dctx, dest: torch.Tensor | None):
    dtype, shape = _DTYPES[e["dtype"]], e["shape"]
    if dest is None:
        dest = torch.empty(shape, dtype=dtype)
    elif dest.dtype != dtype or list(dest.shape) != shape or not dest.is_contiguous():
        raise ValueError(f"tensor {e['name']!r} is {dtype} {shape}, the output is "
                         f"{dest.dtype} {list(dest.shape)} (contiguous: {dest.is_contiguous()})")
    if dest.numel() == 0:
        return dest
    n = dest.numel() * dest.element_size()
    if e["codec"] in _PLANES:
        _merge_planes(mv, pos, e, dctx, _uints(dest).reshape(-1))
        return dest
    if e["codec"] == "zstd":
        data = dctx.decompress(mv[pos:pos + e["parts"][0]], max_output_size=n)
    elif e["codec"] == "raw":
        data = mv[pos:pos + e["parts"][0]]
    else:
        raise CorruptValue(f"unknown codec {e['codec']!r}")
    if len(data) != n:
        raise CorruptValue(f"tensor {e['name']!r} has {len(data)} bytes, expected {n}")
    raw = _uints(dest).reshape(-1)
    raw.view(np.uint8)[:] = np.frombuffer(data, np.uint8)
    if _BIG and raw.itemsize > 1:
        raw.byteswap(inplace=True)
    return dest


def _merge_planes(mv: memoryview, pos: int, e: dict, dctx, u: np.ndarray) -> None:
    """Byte planes, stored lowest first, into `u` (the output's unsigned ints): the top
    plane shifted into place first, then the others or-ed in."""
    count, k, sizes = u.size, u.itemsize, e["parts"]
    if k != _PLANES[e["codec"]] or len(sizes) != k:
        raise CorruptValue(f"tensor {e['name']!r}: {e['codec']} of {len(sizes)} planes "
                           f"for {k}-byte values")
    starts = [pos + sum(sizes[:b]) for b in range(k)]
    for b in reversed(range(k)):
        data = mv[starts[b]:starts[b] + sizes[b]]
        packed = b == 1 if k == 2 else sizes[b] < count      # plane16: the high one
        if packed:
            data = dctx.decompress(data, max_output_size=count)
        if len(data) != count:
            raise CorruptValue(f"tensor {e['name']!r}: a plane of {len(data)} bytes for "
                               f"{count} values")
        plane = np.frombuffer(data, np.uint8)
        if b == k - 1:
            np.left_shift(plane, 8 * b, out=u, dtype=u.dtype)
        elif b:
            np.bitwise_or(u, np.left_shift(plane, 8 * b, dtype=u.dtype), out=u)
        else:
            np.bitwise_or(u, plane, out=u)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()

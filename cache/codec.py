"""Serialization of a cached value: named tensors -> checksummed, compressed bytes.

Layout: MAGIC(4) ‖ version u16 ‖ header length u32 ‖ header JSON ‖ payload ‖ blake2b-16
of everything before it. The header names the model fingerprint and, per tensor,
dtype, shape, codec and byte ranges. 16-bit floats are split into byte planes:
the high plane (sign, exponent, top mantissa bits) is zstd-compressed, the low
plane is near-random and stored as is. Other dtypes are zstd-compressed whole
when that saves bytes. Lossless always.
"""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import torch
import zstandard

MAGIC = b"CKPT"
VERSION = 1
_DTYPES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                               torch.int32, torch.int64, torch.uint8, torch.int8, torch.bool)}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class CorruptValue(ValueError):
    """Checksum mismatch, bad header, or another format/fingerprint: drop and recompute."""


def _raw(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous().cpu()
    n = t.element_size()
    return t.view(getattr(torch, f"uint{8 * n}") if n > 1 else torch.uint8).numpy() \
        .astype(np.dtype(_UINT[n]).newbyteorder("<"), copy=False)


def encode(tensors: dict[str, torch.Tensor], fingerprint: str, level: int = 1) -> bytes:
    cctx = zstandard.ZstdCompressor(level=level)
    meta, chunks, off = [], [], 0
    for name, t in tensors.items():
        if str(t.dtype) not in _DTYPES:
            raise ValueError(f"cannot store dtype {t.dtype}")
        raw = _raw(t).reshape(-1)
        entry = {"name": name, "dtype": str(t.dtype), "shape": list(t.shape)}
        if raw.dtype.itemsize == 2:
            b = raw.view(np.uint8).reshape(-1, 2)
            low, high = b[:, 0].tobytes(), cctx.compress(b[:, 1].tobytes())
            entry.update(codec="plane16", parts=[len(low), len(high)])
            parts = [low, high]
        else:
            data = raw.tobytes()
            packed = cctx.compress(data)
            if len(packed) < len(data):
                entry.update(codec="zstd", parts=[len(packed)])
                parts = [packed]
            else:
                entry.update(codec="raw", parts=[len(data)])
                parts = [data]
        entry["offset"] = off
        off += sum(len(p) for p in parts)
        meta.append(entry)
        chunks += parts
    header = json.dumps({"fp": fingerprint, "tensors": meta}, separators=(",", ":")).encode()
    body = b"".join([MAGIC, struct.pack("<HI", VERSION, len(header)), header, *chunks])
    return body + hashlib.blake2b(body, digest_size=16).digest()


def read_header(blob: bytes) -> dict:
    if len(blob) < 26 or blob[:4] != MAGIC:
        raise CorruptValue("not a ckptd value")
    version, hlen = struct.unpack_from("<HI", blob, 4)
    if version != VERSION:
        raise CorruptValue(f"format version {version}, expected {VERSION}")
    try:
        return json.loads(blob[10:10 + hlen])
    except ValueError:
        raise CorruptValue("bad header") from None


def decode(blob: bytes, fingerprint: str | None) -> dict[str, torch.Tensor]:
    blob = bytes(blob)
    body, digest = blob[:-16], blob[-16:]
    if hashlib.blake2b(body, digest_size=16).digest() != digest:
        raise CorruptValue("checksum mismatch")
    header = read_header(blob)
    if fingerprint is not None and header["fp"] != fingerprint:
        raise CorruptValue("value belongs to another model")
    dctx = zstandard.ZstdDecompressor()
    start = 10 + struct.unpack_from("<I", blob, 6)[0]
    out = {}
    for e in header["tensors"]:
        dtype = _DTYPES[e["dtype"]]
        n = torch.empty((), dtype=dtype).element_size()
        numel = int(np.prod(e["shape"], dtype=np.int64))
        pos = start + e["offset"]
        if e["codec"] == "plane16":
            low = np.frombuffer(blob, np.uint8, e["parts"][0], pos)
            high = dctx.decompress(blob[pos + e["parts"][0]:pos + sum(e["parts"])],
                                   max_output_size=numel)
            planes = np.empty((numel, 2), np.uint8)
            planes[:, 0], planes[:, 1] = low, np.frombuffer(high, np.uint8)
            data = planes.tobytes()
        elif e["codec"] == "zstd":
            data = dctx.decompress(blob[pos:pos + e["parts"][0]], max_output_size=numel * n)
        else:
            data = blob[pos:pos + e["parts"][0]]
        arr = np.frombuffer(data, dtype=np.dtype(_UINT[n]).newbyteorder("<")).astype(_UINT[n])
        t = torch.from_numpy(arr.copy())
        out[e["name"]] = (t.view(dtype) if n > 1 else t.view(dtype)).reshape(e["shape"])
    return out

"""Decoding many values at once: what a restore does with thousands of small KV blocks.

Decoding one value costs a fixed ~60 us of Python and numpy calls (header, views,
four plane merges, a copy into its pool page) whatever its size; a tiny model's block
is 4 KiB, so a 250K-token restore (15,625 blocks) decoded at ~14 MB/s, far below what
zstd and memcpy do. Here each value's per-value work is only its checksum, its
(cached) header, and appending its planes to its group's buffers: the low planes
as stored, the top plane decompressed. Each group of values of one dtype and shape
is then merged with one set of numpy operations over all of them, and copied into
its outputs with one torch call. The bytes on disk are the same (codec.py's format);
only the order of the work changes.

A value this does not fit (several tensors, another codec, no output given, large
enough that its fixed cost does not matter) is decoded alone by codec.decode.
"""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import torch
import xxhash
import zstandard

from ckptd.cache import codec
from ckptd.cache.codec import (
    _BIG,
    _DTYPES,
    _KEY_FIELD,
    _PLANES,
    _PREFIX,
    _SUM,
    MAGIC,
    VERSION,
    CorruptValue,
)

_SMALL = 64 << 10          # bytes of a tensor decoded in a group (larger: alone)
_FLUSH = 2 << 20           # bytes held in the groups before they are merged
_plans: dict[bytes, tuple | bool] = {}     # header less its key -> _plan()
_PLANS_KEPT = 4096
_local = threading.local()


class _Group:
    """Values of one dtype and shape, waiting to be merged: their planes laid end to end
    in this thread's buffers for the shape (kept: fresh memory for every batch faulted
    in at a cost like the merge's own)."""

    def __init__(self, dtype: torch.dtype, shape: torch.Size, k: int) -> None:
        self.dtype, self.shape, self.k = dtype, shape, k
        self.count = math.prod(shape)
        self.dests: list[torch.Tensor] = []
        bufs = getattr(_local, "bufs", None)
        if bufs is None:
            bufs = _local.bufs = {}
        key = (dtype, shape)
        if key not in bufs:
            if len(bufs) >= 4:                           # a model has one or two shapes
                bufs.clear()
            n = _FLUSH // (k * self.count) + 1           # values a group holds at most
            udt = codec._uints(torch.empty(0, dtype=dtype)).dtype
            bufs[key] = (bytearray(n * (k - 1) * self.count), bytearray(n * self.count),
                         np.empty(n * self.count, udt), np.empty(n * self.count, udt))
        self.lows, self.tops, self.out, self.tmp = bufs[key]

    def add(self, lows: memoryview, top, dest: torch.Tensor) -> None:
        j, lo, c = len(self.dests), len(lows), self.count
        self.lows[j * lo:(j + 1) * lo] = lows
        self.tops[j * c:(j + 1) * c] = top
        self.dests.append(dest)

    def merge(self) -> None:
        n, k, c = len(self.dests), self.k, self.count
        lows = np.frombuffer(self.lows, np.uint8, n * (k - 1) * c).reshape(n, k - 1, c)
        top = np.frombuffer(self.tops, np.uint8, n * c).reshape(n, c)
        out, tmp = self.out[:n * c].reshape(n, c), self.tmp[:n * c].reshape(n, c)
        np.left_shift(top, 8 * (k - 1), out=out, dtype=out.dtype)
        np.bitwise_or(out, lows[:, 0], out=out)
        for b in range(1, k - 1):
            np.left_shift(lows[:, b], 8 * b, out=tmp, dtype=out.dtype)
            np.bitwise_or(out, tmp, out=out)
        src = torch.from_numpy(out).view(self.dtype).view(n, *self.shape)
        torch._foreach_copy_(self.dests, list(src.unbind(0)))
        del lows, top                  # the buffers' exports: they are written again


def decode_many(values: list[tuple[memoryview | bytes | None, bytes | None, dict | None]],
                fingerprint: str | None) -> list[dict | None]:
    """codec.decode of each (value, key, into) in order: the tensors, or None for a value
    that is None or fails verification (never partly written data: an output is only
    written once its value was verified, though a later value's failure does not undo
    an earlier one's). The buffers need stay valid only during this call."""
    out: list[dict | None] = [None] * len(values)
    groups: dict[tuple, _Group] = {}
    held = 0
    dctx = codec._decompressor()
    for i, (blob, key, into) in enumerate(values):
        if blob is None:
            continue
        try:
            try:
                got = _append(blob, key, into, fingerprint, dctx, groups)
            except ValueError:
                got = None                 # a header not as encode writes it
            if got is None:
                out[i] = _alone(blob, fingerprint, into, key)
            else:
                out[i], n = got
                held += n
        except CorruptValue:
            out[i] = None
        if held >= _FLUSH:
            _merge(groups)
            held = 0
    _merge(groups)
    return out


def _alone(blob, fingerprint: str | None, into: dict | None, key: bytes | None) -> dict:
    """codec.decode, into outputs of any strides (a CPU pool's pages are strided views):
    a strided one gets its tensor decoded beside it, then copied in."""
    strided = {n: t for n, t in (into or {}).items() if not t.is_contiguous()}
    if not strided:
        return codec.decode(blob, fingerprint, into, key)
    got = codec.decode(blob, fingerprint, {n: t for n, t in into.items() if n not in strided},
                       key)
    for n, t in strided.items():
        if n in got:
            t.copy_(got[n])
            got[n] = t
    return got


def _merge(groups: dict[tuple, _Group]) -> None:
    for g in groups.values():
        g.merge()
    groups.clear()


def _append(blob, key: bytes | None, into: dict | None, fingerprint: str | None, dctx,
            groups: dict[tuple, _Group]) -> tuple[dict, int] | None:
    """Verify one value and, when it fits a group, add it there: (its outputs, bytes
    held). None: decode it alone. CorruptValue when it is bad."""
    if into is None or _BIG:
        return None
    mv = memoryview(blob)
    if len(mv) < _PREFIX.size + _SUM or xxhash.xxh3_128_digest(mv[:-_SUM]) != mv[-_SUM:]:
        return None                        # codec.decode says what is wrong with it
    magic, version, hlen = _PREFIX.unpack_from(mv, 0)
    raw = bytes(mv[_PREFIX.size:_PREFIX.size + hlen])
    cut = raw.rfind(_KEY_FIELD)
    keyhex = raw[cut + len(_KEY_FIELD):-2]
    if magic != MAGIC or version != VERSION or cut < 0 or not raw.endswith(b'"}'):
        return None
    rest = raw[:cut] + b"}"
    plan = _plans.get(rest)
    if plan is None:
        if len(_plans) >= _PLANS_KEPT:
            _plans.clear()
        plan = _plans[rest] = _plan(json.loads(rest))
    if not plan:
        return None
    fp, name, dtype, shape, k, offset, top_size = plan
    dest = into.get(name)
    if dest is None or dest.dtype != dtype or dest.shape != shape:
        return None
    # checked as codec.verify does: model and key
    if fingerprint is not None and fp != fingerprint:
        raise CorruptValue("another model's value")
    if key is not None and keyhex != key.hex().encode():
        raise CorruptValue("another key's value")
    count = dest.numel()
    pos = _PREFIX.size + hlen + offset
    end = pos + (k - 1) * count
    if end + top_size > len(mv) - _SUM:
        raise CorruptValue("a tensor beyond the value's end")
    top = mv[end:end + top_size]
    if k == 2 or top_size < count:         # plane16's high plane is always packed
        try:
            top = dctx.decompress(top, max_output_size=count)
        except zstandard.ZstdError as err:
            raise CorruptValue(f"undecodable value: {err}") from None
        if len(top) != count:
            raise CorruptValue("a plane of the wrong size")
    g = groups.get((dtype, shape))
    if g is None:
        g = groups[(dtype, shape)] = _Group(dtype, shape, k)
    g.add(mv[pos:end], top, dest)
    return {name: dest}, count * k


def _plan(header) -> tuple | bool:
    """What decoding a value of this header (less its key) in a group takes: (model,
    tensor name, dtype, shape, bytes per element, offset, top plane's stored size),
    or False where it is not one small plane-coded tensor as this build writes."""
    if not isinstance(header, dict) or not isinstance(header.get("tensors"), list) \
            or len(header["tensors"]) != 1:
        return False
    e = header["tensors"][0]
    k, dtype = _PLANES.get(e.get("codec")), _DTYPES.get(e.get("dtype"))
    shape, sizes = e.get("shape"), e.get("parts")
    if k is None or dtype is None or not isinstance(shape, list) \
            or not isinstance(sizes, list) or len(sizes) != k \
            or not all(isinstance(n, int) and n >= 0 for n in [*shape, *sizes]) \
            or not isinstance(e.get("offset"), int) or e["offset"] < 0:
        return False
    count = math.prod(shape)
    if not count or count * k > _SMALL or torch.empty((), dtype=dtype).element_size() != k \
            or any(n != count for n in sizes[:-1]) or sizes[-1] > count:
        return False                       # a low plane packed: decoded alone
    return header.get("fp"), e.get("name"), dtype, torch.Size(shape), k, e["offset"], sizes[-1]


def encode_pages(pages: torch.Tensor, fingerprint: str, keys: list[bytes]) -> list[bytes]:
    """codec.encode({"kv": page}, fingerprint, key=key) of each page of pages [n, ...]
    (contiguous, CPU), the same bytes: what a remote restore writes through into LMDB,
    ~15,000 pages for a 250K-token context. The byte planes of all pages are split with
    one numpy operation each and the header is written from a template, so a page costs
    its planes' compression and checksum, not ~170 us of per-value Python."""
    codec_name = {2: "plane16", 4: "plane32"}.get(pages.element_size())
    if pages.dtype not in (torch.float16, torch.bfloat16, torch.float32) or _BIG \
            or not pages.is_contiguous() or codec_name is None:
        return [codec.encode({"kv": p}, fingerprint, key=k) for p, k in zip(pages, keys)]
    n, k = len(pages), pages.element_size()
    u = codec._uints(pages).reshape(n, -1)
    planes = [(u >> (8 * b)).astype(np.uint8) for b in range(k)]
    pctx = zstandard.ZstdCompressor(compression_params=codec._PLANE_ZSTD)
    dtype = str(pages.dtype).removeprefix("torch.")
    shape = json.dumps(list(pages.shape[1:]), separators=(",", ":"))
    head = (f'{{"fp":{json.dumps(fingerprint)},"tensors":[{{"name":"kv","dtype":"{dtype}",'
            f'"shape":{shape},"codec":"{codec_name}","offset":0,"parts":[')
    out = []
    for i, key in enumerate(keys):
        if k == 2:
            parts = [planes[0][i], pctx.compress(planes[1][i])]
        else:
            parts = []
            for p in planes:
                c = pctx.compress(p[i])
                parts.append(c if len(c) < p.shape[1] else p[i])
        sizes = ",".join(str(x.nbytes if isinstance(x, np.ndarray) else len(x)) for x in parts)
        header = f'{head}{sizes}]}}],"key":"{key.hex()}"}}'.encode()
        body = b"".join([_PREFIX.pack(MAGIC, VERSION, len(header)), header, *parts])
        out.append(body + xxhash.xxh3_128_digest(body))
    return out

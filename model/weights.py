"""Checkpoint tensors, memory-mapped and read on demand.

A source lists its tensors (names and shapes from the file headers alone) and hands
out one at a time: a view of the mapped file where the bytes already are the tensor,
so nothing is copied until the model needs another dtype, layout or device. Pages
read for a tensor stay resident while the file is mapped, counted in the process's
RSS; `release()` drops those read since the last call (they are re-read from the page
cache if a view is used later), so a load holds about one tensor of mapped pages at a
time besides the model itself, and `release(everything=True)` drops the rest once the
model is built.

    src = SafetensorsSource([shard1, shard2])
    src.shape("model.norm.weight"); t = src.get("model.norm.weight"); src.release()
"""

from __future__ import annotations

import json
import mmap
import struct
import warnings
from pathlib import Path

import torch

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
_PAGE = mmap.PAGESIZE


def view(buffer, dtype: torch.dtype, offset: int, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor over bytes [offset, ...) of a read-only buffer, without a copy."""
    n = 1
    for s in shape:
        n *= s
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    with warnings.catch_warnings():
        # the mapping is read-only and the model never writes its weights
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(buffer, dtype=dtype, count=n, offset=offset).view(shape)


def drop_pages(mm: mmap.mmap, ranges: list[tuple[int, int]]) -> None:
    """Drop the resident pages of byte ranges [start, end) of a read-only mapping: the
    next access reads them again, so this only ever costs time."""
    for start, end in ranges:
        lo = start - start % _PAGE
        if end > lo:
            try:
                mm.madvise(mmap.MADV_DONTNEED, lo, end - lo)
            except (OSError, ValueError, AttributeError):   # not Linux: pages stay
                return


class SafetensorsSource:
    """The tensors of one or more .safetensors files (a sharded checkpoint)."""

    def __init__(self, files: list[Path]) -> None:
        self.files = [Path(f) for f in files]
        # name -> (file index, dtype, shape, begin, end): absolute byte offsets
        self.index: dict[str, tuple[int, torch.dtype, tuple[int, ...], int, int]] = {}
        self._maps: list[mmap.mmap | None] = [None] * len(self.files)
        self._read: set[int] = set()
        for i, f in enumerate(self.files):
            for name, entry in _header(f).items():
                if name in self.index:
                    raise ValueError(f"tensor {name!r} appears in {self.files[self.index[name][0]]}"
                                     f" and in {f}")
                self.index[name] = (i, *entry)

    def names(self) -> list[str]:
        return list(self.index)

    def __contains__(self, name: str) -> bool:
        return name in self.index

    def shape(self, name: str) -> tuple[int, ...]:
        return self.index[name][2]

    def get(self, name: str) -> torch.Tensor:
        i, dtype, shape, begin, end = self.index[name]
        mm = self._map(i)
        self._read.add(i)
        return view(mm, dtype, begin, shape)

    def release(self, everything: bool = False) -> None:
        """Drop the mapped pages of the files read since the last call (everything: of
        every file)."""
        for i, mm in enumerate(self._maps):
            if mm is not None and (everything or i in self._read):
                drop_pages(mm, [(0, len(mm))])
        self._read.clear()

    def _map(self, i: int) -> mmap.mmap:
        mm = self._maps[i]
        if mm is None:
            with open(self.files[i], "rb") as fh:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[i] = mm
        return mm


def _header(f: Path) -> dict[str, tuple[torch.dtype, tuple[int, ...], int, int]]:
    """name -> (dtype, shape, begin, end) from a safetensors file's header; ValueError
    naming the file when it is not one (or is truncated)."""
    try:
        size = f.stat().st_size
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            if n > min(size - 8, 100 << 20):
                raise ValueError(f"header length {n} does not fit the file")
            header = json.loads(fh.read(n))
    except (OSError, struct.error, UnicodeDecodeError, json.JSONDecodeError, ValueError) as e:
        raise ValueError(f"cannot read {f} (truncated or not safetensors?): {e}") from None
    out = {}
    base = 8 + n
    for name, e in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES[e["dtype"]]
            shape = tuple(int(s) for s in e["shape"])
            begin, end = (base + int(o) for o in e["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"cannot read {f}: bad header entry for {name!r} "
                             f"({str(e)[:80]})") from None
        numel = 1
        for s in shape:
            numel *= s
        if end - begin != numel * dtype.itemsize or end > size:
            raise ValueError(f"cannot read {f} (truncated or not safetensors?): tensor "
                             f"{name!r} [{begin}, {end}) does not fit {size} bytes")
        out[name] = (dtype, shape, begin, end)
    return out

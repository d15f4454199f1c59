"""Paging memory in ahead of use, with madvise; each call drops the GIL (ctypes), so a
thread waiting here for the disk or the kernel leaves the other threads running.

A cold restore pays twice per page of 4 KiB: the kernel reads the value's file page,
and it faults in the fresh output page the value decodes into (docs/BENCHMARKS.md,
Measurements behind the code).
Done one fault at a time inside the decoders, both stall them; done here, in large
ranges and ahead of them, the disk and the decoders overlap.

All of it is a hint: where madvise is missing or refuses (an older kernel), nothing
happens and the first touch pays as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap

import numpy as np
import torch

_PAGE = mmap.PAGESIZE
_WILLNEED = getattr(mmap, "MADV_WILLNEED", None)
# Linux 5.14+: fault the range in now, as a read or a write would, without touching it.
_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if _WILLNEED else None


def _advise(addr: int, n: int, advice: int, whole_pages: bool) -> None:
    """madvise over [addr, addr + n): rounded out to pages, or in to the pages wholly
    inside it (`whole_pages`, for memory that shares its edge pages with other data)."""
    if _libc is None or n <= 0:
        return
    if whole_pages:
        start, end = -(-addr // _PAGE) * _PAGE, (addr + n) // _PAGE * _PAGE
    else:
        start, end = addr - addr % _PAGE, addr + n
    if end > start:
        _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), advice)


def _address(buf: memoryview) -> int:
    return np.frombuffer(buf, np.uint8).ctypes.data


def willneed(buf: memoryview) -> None:
    """Start reading a mapped file range; returns once the reads are queued."""
    if len(buf):
        _advise(_address(buf), len(buf), _WILLNEED, False)


def read_now(buf: memoryview) -> None:
    """Fault a mapped file range in, waiting for its reads."""
    if len(buf):
        _advise(_address(buf), len(buf), _POPULATE_READ, False)


def write_ready(t: torch.Tensor) -> None:
    """Fault in the memory of a contiguous CPU tensor that is about to be written (the
    contents stay as they are)."""
    _advise(t.data_ptr(), t.numel() * t.element_size(), _POPULATE_WRITE, True)


def write_ready_pages(addresses: list[int], nbytes: int) -> None:
    """write_ready for pages of nbytes each at these addresses (-1: none), one call a run
    of pages that lie end to end."""
    a = np.asarray([x for x in addresses if x >= 0], dtype=np.int64)
    if not len(a):
        return
    a.sort()
    cut = np.flatnonzero(np.diff(a) != nbytes) + 1
    for run in np.split(a, cut):
        _advise(int(run[0]), len(run) * nbytes, _POPULATE_WRITE, True)

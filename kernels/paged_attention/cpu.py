"""Attention over a sequence's pages in place on the CPU: cpu.c, built by
kernels/cbuild.py and called through ctypes (it releases the GIL and runs on the
process's OpenMP threads).

    attend(q, memory, layer, table, n, scale, block_size) -> (out, lse)

A decode step's query rows over every key of its sequence, read where the pages lie in
a head-major fp32 or fp16 pool (layout.py; fp16 where the CPU has F16C): no gather
of the context, no span plan, and its cost follows the context, not the pool's
fragmentation. `available()` is False where
no compiler works (or CKPTD_ATTN_CPU=0); sdpa.py then attends through torch's fused
kernel as before.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ckptd.kernels import cbuild

_SRC = Path(__file__).with_name("cpu.c")
# no -ffast-math: linking a shared library with it (GCC 12) adds crtfastmath.o, which
# turns on flush-to-zero for the whole process that loads it (hypothesis saw subnormals
# vanish in the test process); the scores' exp is then glibc's scalar expf
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC"]
MAX_BLOCK = 256        # cpu.c's page buffer
MAX_HEAD_DIM = 1024    # cpu.c's rotated key row
_ITEMS_PER_THREAD = 8  # (kv head, run of pages) items: enough to even out the threads
_MIN_PAGES = 4         # per item


def _bind(dll: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    dll.ckpa_attend.argtypes = [ptr, ptr, ptr, i64, ptr, i64, i64, i64, i64, i64,
                                ctypes.c_float, i64, ptr, ptr, ptr, ctypes.c_int, ctypes.c_int]
    dll.ckpa_attend.restype = None
    dll.ckpa_decode_step.argtypes = [ptr, i64, i64, i64, i64, ptr, ptr, i64, ptr, ptr, i64,
                                     ptr, ptr, i64, ptr, i64, ctypes.c_float, i64, ptr, ptr,
                                     ptr, ctypes.c_int, ctypes.c_int]
    dll.ckpa_decode_step.restype = None
    dll.ckpa_half.argtypes = []
    dll.ckpa_half.restype = ctypes.c_int


library = cbuild.Library(_SRC, _FLAGS, "ckpa", "CKPTD_ATTN_CPU", _bind,
                         "attention runs through torch's fused kernel instead")


def available() -> bool:
    """Whether the compiled kernel loads here (built on first call)."""
    return library.load() is not None


def reads(dtype: torch.dtype) -> bool:
    """Whether the kernel reads a pool of this dtype here: fp32, and fp16 where it was
    built with F16C (x86 since 2013)."""
    if dtype == torch.float32:
        return available()
    return dtype == torch.float16 and available() and bool(library.lib.ckpa_half())


def supports(memory: torch.Tensor, q: torch.Tensor, block_size: int) -> bool:
    """A head-major fp32 or fp16 pool on the CPU (layout.head_major's view), fp32
    queries."""
    return (memory.device.type == "cpu" and q.device.type == "cpu"
            and q.dtype == torch.float32 and memory.is_contiguous()
            and block_size <= MAX_BLOCK and memory.shape[-1] <= MAX_HEAD_DIM
            and reads(memory.dtype))


def attend(q: torch.Tensor, memory: torch.Tensor, layer: int, table: torch.Tensor, n: int,
           scale: float, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [Hq, T, D] rows that see keys 0..n-1 of the sequence whose pages are `table`
    (host int32, at least ceil(n / block_size) of them) in memory [n_attn, 2, Hkv,
    P * B, D]. Returns out [Hq, T, D] and the log-sum-exp of the scaled scores [Hq, T]."""
    Hq, T, D = q.shape
    Hkv, rows = memory.shape[2], memory.shape[3]
    R = Hq // Hkv * T                     # query rows per kv head (GQA)
    pages = -(-n // block_size)
    if table.dtype != torch.int32 or not table.is_contiguous():
        table = table.to(torch.int32).contiguous()
    if table.numel() < pages:
        raise ValueError(f"a page table of {table.numel()} pages for {n} keys")
    qh = q.reshape(Hkv, R, D).contiguous()
    # on q's device by name: under a meta default device a bare torch.empty would hand
    # the C code a null pointer
    out = torch.empty(Hkv, R, D, dtype=torch.float32, device=q.device)
    lse = torch.empty(Hkv, R, dtype=torch.float32, device=q.device)
    threads = torch.get_num_threads()
    splits = max(1, min(pages // _MIN_PAGES, -(-_ITEMS_PER_THREAD * threads // Hkv)))
    splits = min(splits, pages)
    work = torch.empty(Hkv * splits * R * (D + 2), dtype=torch.float32, device=q.device)
    kv = memory[layer]
    library.lib.ckpa_attend(qh.data_ptr(), kv[0].data_ptr(), kv[1].data_ptr(), rows * D,
                     table.data_ptr(), n, block_size, D, Hkv, R, scale, splits,
                     out.data_ptr(), lse.data_ptr(), work.data_ptr(), threads,
                     memory.dtype == torch.float16)
    return out.view(Hq, T, D), lse.view(Hq, T)


def decode_splits(n_seqs: int, max_len: int, Hkv: int, block_size: int, threads: int) -> int:
    """Runs of pages per (sequence, kv head) for a decode step: enough items to even out
    the threads, each of at least a few pages (attend's rule, over n_seqs sequences)."""
    pages = -(-max_len // block_size)
    items = -(-_ITEMS_PER_THREAD * threads // (Hkv * n_seqs))
    return max(1, min(pages // _MIN_PAGES, items, pages))


def decode_scratch(n_seqs: int, heads: tuple[int, int], D: int, splits: int) -> int:
    """fp32 values of decode_step's scratch: the rotated queries and the items' work."""
    Hq, Hkv = heads
    return n_seqs * Hq * D + n_seqs * Hkv * splits * (Hq // Hkv) * (D + 2)


def decode_step(qkv: torch.Tensor, memory: torch.Tensor, layer: int, cos: torch.Tensor,
                sin: torch.Tensor, kv_index: torch.Tensor, tables: torch.Tensor,
                lens: torch.Tensor, heads: tuple[int, int], scale: float, block_size: int,
                splits: int, out: torch.Tensor | None = None,
                scratch: torch.Tensor | None = None) -> torch.Tensor:
    """One attention layer of a decode step after its q/k/v projection, in one call:
    qkv [N, (Hq + 2 Hkv) * D] fp32; each token's q and k rotated by cos, sin [N, R]
    (rotate-half, the first R dims), its k and v written at kv_index [N] (int64, page *
    B + offset) of `layer` in head-major memory [n_attn, 2, Hkv, P * B, D] (fp32, or fp16
    where reads() says: k rotated in fp32, then rounded), and its query
    heads attend keys 0 .. lens[i] - 1 (int32 [N], the new one included) of its pages
    tables[i] (int32 [N, W]). heads: (Hq, Hkv). Returns [N, Hq * D] (into `out` when
    given); scratch: decode_scratch(...) fp32 values, or None to allocate them.

    The caller checks the arguments once per step (model/arch/decode_cpu.py): the C
    code trusts every index, so the tables must hold each sequence's pages."""
    Hq, Hkv = heads
    N, D = qkv.shape[0], memory.shape[-1]
    if out is None:
        out = torch.empty(N, Hq * D, dtype=torch.float32, device=qkv.device)
    if scratch is None:
        scratch = torch.empty(decode_scratch(N, heads, D, splits), dtype=torch.float32,
                              device=qkv.device)
    q = scratch.data_ptr()
    work = q + N * Hq * D * 4
    es = memory.element_size()
    k = memory.data_ptr() + layer * memory.stride(0) * es      # no views: a step asks
    v = k + memory.stride(1) * es                               # once per layer
    library.lib.ckpa_decode_step(
        qkv.data_ptr(), N, Hq, Hkv, D, cos.data_ptr(), sin.data_ptr(), cos.shape[-1],
        k, v, memory.stride(2), kv_index.data_ptr(), tables.data_ptr(), tables.shape[1],
        lens.data_ptr(), block_size, scale, splits, q, out.data_ptr(), work,
        torch.get_num_threads(), memory.dtype == torch.float16)
    return out

"""The CPU path for kept weights: cpu.c, compiled once per machine and called through
ctypes (it releases the GIL and runs on the process's OpenMP threads).

    matmul(x, qt)     x [M, K] fp32 @ W.T: a few rows (decode) multiply block by block
                      without expanding W; longer steps dequantize CHUNK rows of W at a
                      time into one reused buffer and let MKL multiply them
    dequantize(qt, rows)     fp32 rows (embedding lookups)

The library is built by kernels/cbuild.py (once per machine, source and flags);
`available()` is False where no compiler works, and kernels/quant/naive.py serves
instead (slower, same values).
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch

from ckptd.kernels import cbuild
from ckptd.kernels.quant.formats import FORMATS, QuantTensor

_SRC = Path(__file__).with_name("cpu.c")
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno",
          "-shared", "-fPIC"]
GEMV_ROWS = 16          # steps of up to this many tokens multiply without a buffer
_CHUNK_BYTES = 4 << 20  # fp32 rows dequantized per MKL call: stays in L2/L3


def _bind(dll: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    dll.ckq_dequant.argtypes = [ctypes.c_int, ptr, i64, i64, i64, i64, ptr, ctypes.c_int]
    dll.ckq_gemv.argtypes = [ctypes.c_int, ptr, i64, i64, i64, ptr, i64, ptr, ptr,
                             ctypes.c_int]
    dll.ckq_dequant.restype = dll.ckq_gemv.restype = None


library = cbuild.Library(_SRC, _FLAGS, "ckq", "CKPTD_QUANT_CPU", _bind,
                         "kept weights dequantize with plain torch instead")


def available() -> bool:
    """Whether the compiled kernels load here (built on first call)."""
    return library.load() is not None


def supports(qt: QuantTensor) -> bool:
    """The C kernels take any kept format on a CPU tensor with contiguous rows (F16/BF16
    rows of whole 32-value groups)."""
    return (qt.data.device.type == "cpu" and qt.data.dim() == 2 and qt.data.stride(-1) == 1
            and qt.shape[-1] % 32 == 0 and available())


_local = threading.local()


def _scratch(n: int) -> torch.Tensor:
    """gemv's per-thread rows (n floats), kept per calling thread: a decode step
    multiplies ~100 times, and the rows are scratch, read only after written."""
    buf = getattr(_local, "scratch", None)
    if buf is None or buf.numel() < n:
        buf = _local.scratch = torch.empty(n, dtype=torch.float32, device="cpu")
    return buf


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def dequantize_rows(qt: QuantTensor, r0: int, r1: int, out: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """fp32 rows [r0, r1) of a 2-D kept tensor (into `out` [r1 - r0, K] when given)."""
    K = qt.shape[-1]
    if out is None:
        out = torch.empty(r1 - r0, K, dtype=torch.float32)
    library.lib.ckq_dequant(FORMATS[qt.fmt][0], _ptr(qt.data), qt.data.stride(0), r0, r1, K,
                     _ptr(out), torch.get_num_threads())
    return out


def matmul(x: torch.Tensor, qt: QuantTensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """x [M, K] fp32 @ W.T (+ bias) -> [M, N] fp32, W a 2-D kept tensor [N, K]."""
    x = x.contiguous()
    M, K = x.shape
    N = qt.shape[0]
    if M <= GEMV_ROWS:
        y = torch.empty(M, N, dtype=torch.float32)
        threads = torch.get_num_threads()
        scratch = _scratch(threads * K)                           # a row per thread
        library.lib.ckq_gemv(FORMATS[qt.fmt][0], _ptr(qt.data), qt.data.stride(0), N, K, _ptr(x), M,
                      _ptr(y), _ptr(scratch), threads)
        return y if bias is None else y.add_(bias)
    y = torch.empty(M, N, dtype=torch.float32)
    step = max(1, _CHUNK_BYTES // (4 * K))
    buf = torch.empty(min(step, N), K, dtype=torch.float32)
    for r0 in range(0, N, step):
        r1 = min(N, r0 + step)
        w = dequantize_rows(qt, r0, r1, buf[:r1 - r0])
        torch.matmul(x, w.t(), out=y[:, r0:r1])
    return y if bias is None else y.add_(bias)

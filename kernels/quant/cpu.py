"""The CPU path for kept weights: cpu.c, compiled once per machine and called through
ctypes (it releases the GIL and runs on the process's OpenMP threads).

    matmul(x, qt)     x [M, K] fp32 @ W.T: a few rows (decode) multiply block by block
                      without expanding W; longer steps dequantize CHUNK rows of W at a
                      time into one reused buffer and let MKL multiply them
    matmul(x, qt, activations="q8")    Q4_0 / Q4_1 / Q8_0 multiply in integers, every
                      step's rows, the input rounded to int8 per block of 32 (as
                      llama.cpp does; the logits change by ~6% of their norm); "fp32"
                      (the default): the weights' values dequantized exactly, in fp32
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
ACTIVATIONS = ("fp32", "q8")
Q8_FORMATS = ("Q4_0", "Q4_1", "Q8_0")      # the formats with an integer dot in cpu.c
GEMV_ROWS = 16          # steps of up to this many tokens multiply without a buffer
_CHUNK_BYTES = 4 << 20  # fp32 rows dequantized per MKL call: stays in L2/L3


def _bind(dll: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    dll.ckq_dequant.argtypes = [ctypes.c_int, ptr, i64, i64, i64, i64, ptr, ctypes.c_int]
    dll.ckq_gemv.argtypes = [ctypes.c_int, ptr, i64, i64, i64, ptr, i64, ptr, ptr,
                             ctypes.c_int]
    dll.ckq_dequant.restype = dll.ckq_gemv.restype = None
    dll.ckq_quantize_q8.argtypes = [ptr, i64, i64, ptr, ptr]
    dll.ckq_quantize_q8.restype = None
    dll.ckq_gemv_q8.argtypes = [ctypes.c_int, ptr, i64, i64, i64, ptr, ptr, i64, ptr,
                                ctypes.c_int]
    dll.ckq_matmul_q8.argtypes = [ctypes.c_int, ptr, i64, i64, i64, ptr, i64, ptr, ptr,
                                  ctypes.c_int, ptr, ctypes.c_int]
    dll.ckq_gemv_q8.restype = dll.ckq_matmul_q8.restype = ctypes.c_int


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
_CPU = torch.device("cpu")      # by name: under a meta default device torch.empty is null


def _scratch(n: int) -> torch.Tensor:
    """gemv's per-thread rows (n floats), kept per calling thread: a decode step
    multiplies ~100 times, and the rows are scratch, read only after written."""
    buf = getattr(_local, "scratch", None)
    if buf is None or buf.numel() < n:
        buf = _local.scratch = torch.empty(n, dtype=torch.float32, device="cpu")
    return buf


def _q8_scratch(n: int) -> tuple[int, int]:
    """Addresses of n int8 values and n / 16 floats (x's quantization: q, and each block's
    d and d * sum q), kept per calling thread and overwritten by its next matmul that
    quantizes. Addresses, not views: a view costs microseconds, ~100 times a step."""
    buf = getattr(_local, "q8", None)
    if buf is None or buf[0].numel() < n:
        buf = _local.q8 = (torch.empty(n, dtype=torch.int8, device=_CPU),
                           torch.empty(n // 16, dtype=torch.float32, device=_CPU))
    return buf[0].data_ptr(), buf[1].data_ptr()


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


def quantize_q8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] fp32 (K a multiple of 32) -> (q int8 [M, K], ds fp32 [M, K / 32, 2]):
    per block of 32 the scale d and d * (the sum of its q)."""
    x = x.contiguous()
    M, K = x.shape
    q = torch.empty(M, K, dtype=torch.int8, device=_CPU)
    ds = torch.empty(M, K // 32, 2, dtype=torch.float32, device=_CPU)
    library.load().ckq_quantize_q8(_ptr(x), M, K, _ptr(q), _ptr(ds))
    return q, ds


def gemv_q8(xq: tuple[torch.Tensor, torch.Tensor], qt: QuantTensor) -> torch.Tensor:
    """quantize_q8's x [M, K] @ W.T -> [M, N] fp32 in integers, W Q4_0 / Q4_1 / Q8_0."""
    q, ds = xq
    M, K = q.shape
    N = qt.shape[0]
    y = torch.empty(M, N, dtype=torch.float32, device=_CPU)
    if library.load().ckq_gemv_q8(FORMATS[qt.fmt][0], _ptr(qt.data), qt.data.stride(0), N, K,
                               _ptr(q), _ptr(ds), M, _ptr(y), torch.get_num_threads()):
        raise ValueError(f"no integer dot for {qt.fmt}")
    return y


def matmul(x: torch.Tensor, qt: QuantTensor, bias: torch.Tensor | None = None,
           shared: dict | None = None, activations: str = "fp32") -> torch.Tensor:
    """x [M, K] fp32 @ W.T (+ bias) -> [M, N] fp32, W a 2-D kept tensor [N, K].
    activations: "fp32" or "q8" (the module's docstring; formats without an integer dot
    multiply in fp32 either way). With q8 every step multiplies in integers, prefill
    too: each row's product then depends on that row alone, so a token's KV is the same
    whether it was decoded or prefilled (cached answers equal uncached ones; with the
    fp32 path the two differ by ~1e-6, with q8 decode beside an fp32 prefill by ~1%).
    `shared`: a dict the matmuls of one input (KeptMatmul's parts) pass along, so that
    x is quantized once for all of them."""
    x = x.contiguous()
    M, K = x.shape
    N = qt.shape[0]
    if activations == "q8" and qt.fmt in Q8_FORMATS:
        # one C call (this runs ~120 times a decode step): x quantized into this
        # thread's scratch, kept for the next part of the same KeptMatmul call
        made = shared is not None and "q8" in shared
        q, ds = shared["q8"] if made else _q8_scratch(M * K)
        if shared is not None:
            shared["q8"] = (q, ds)
        y = torch.empty(M, N, dtype=torch.float32, device=_CPU)
        library.lib.ckq_matmul_q8(FORMATS[qt.fmt][0], qt.data.data_ptr(), qt.data.stride(0), N,
                                  K, x.data_ptr(), M, q, ds, 0 if made else 1, y.data_ptr(),
                                  torch.get_num_threads())
        return y if bias is None else y.add_(bias)
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

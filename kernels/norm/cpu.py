"""A decode step's row ops on the CPU: cpu.c, built by kernels/cbuild.py and called
through ctypes. fp32 rows only; `available()` is False where no compiler works (or
CKPTD_NORM_CPU=0), and the torch references serve instead.

    rms_norm(x, weight, eps, offset)            as naive.rms_norm, in one call
    add_rms_norm(x, delta, weight, eps, offset) x += delta in place; rms_norm(x)
    silu_and_mul(gate_up)                       silu(gate) * up of [gate | up] rows
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ckptd.kernels import cbuild

_SRC = Path(__file__).with_name("cpu.c")
_FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared",
          "-fPIC"]


def _bind(dll: ctypes.CDLL) -> None:
    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    dll.ckn_rms_norm.argtypes = [ptr, ptr, f32, f32, i64, i64, ptr]
    dll.ckn_add_rms_norm.argtypes = [ptr, ptr, ptr, f32, f32, i64, i64, ptr]
    dll.ckn_silu_mul.argtypes = [ptr, i64, i64, ptr]
    dll.ckn_rms_norm.restype = dll.ckn_add_rms_norm.restype = None
    dll.ckn_silu_mul.restype = None


library = cbuild.Library(_SRC, _FLAGS, "ckn", "CKPTD_NORM_CPU", _bind,
                         "norms and SwiGLU run as torch ops instead")


def available() -> bool:
    """Whether the compiled kernels load here (built on first call)."""
    return library.load() is not None


def _rows(x: torch.Tensor) -> tuple[int, int]:
    if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous():
        raise ValueError("the CPU row ops take contiguous fp32 CPU tensors")
    return x.numel() // x.shape[-1], x.shape[-1]


def _check_weight(weight: torch.Tensor, D: int) -> None:
    if weight.dtype != torch.float32 or weight.numel() != D or not weight.is_contiguous():
        raise ValueError(f"a norm weight of {D} contiguous fp32 values, got "
                         f"{weight.dtype} {tuple(weight.shape)}")


def _out(out: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=torch.float32, device="cpu")   # not a meta default
    if out.shape != shape or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"an output of {shape} contiguous fp32 values, got "
                         f"{out.dtype} {tuple(out.shape)}")
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., D] / rms * (weight + offset), into `out` (x's shape) or a new tensor."""
    rows, D = _rows(x)
    _check_weight(weight, D)
    out = _out(out, x.shape)
    library.lib.ckn_rms_norm(x.data_ptr(), weight.data_ptr(), offset, eps, rows, D,
                             out.data_ptr())
    return out


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                 offset: float = 0.0, out: torch.Tensor | None = None) -> torch.Tensor:
    """x += delta (in place), then rms_norm(x) (into `out` when given)."""
    rows, D = _rows(x)
    if _rows(delta) != (rows, D):
        raise ValueError(f"delta {tuple(delta.shape)} for x {tuple(x.shape)}")
    _check_weight(weight, D)
    out = _out(out, x.shape)
    library.lib.ckn_add_rms_norm(x.data_ptr(), delta.data_ptr(), weight.data_ptr(), offset,
                                 eps, rows, D, out.data_ptr())
    return out


def silu_and_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gate_up [..., 2 I] = [gate | up] -> silu(gate) * up [..., I] (into `out`)."""
    rows, two_i = _rows(gate_up)
    out = _out(out, (*gate_up.shape[:-1], two_i // 2))
    library.lib.ckn_silu_mul(gate_up.data_ptr(), rows, two_i // 2, out.data_ptr())
    return out

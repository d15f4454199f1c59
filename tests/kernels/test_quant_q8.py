"""--gemv-activations q8 (kernels/quant/cpu.c's integer dot) against its numpy model
(tests/kernels/q8_model.py), bit for bit: the int8 activations, and each format's
product, built for this CPU (AVX2 / VNNI) and as the portable scalar code; cpu.matmul
takes the integer path only where it should (Q4_0 / Q4_1 / Q8_0, steps of any size)."""

from __future__ import annotations

import platform

import numpy as np
import pytest
import torch

from ckptd.kernels import cbuild
from ckptd.kernels.quant import cpu
from ckptd.model.quant import KeptMatmul
from tests.kernels import q8_model
from tests.kernels.quant_data import kept

needs_cc = pytest.mark.skipif(not cpu.available(), reason="no C compiler for kernels/quant/cpu.c")
FORMATS = cpu.Q8_FORMATS


def _x(M: int, K: int, seed: int = 0) -> torch.Tensor:
    """Activations with the blocks that test the rounding: all zero, one huge outlier
    (the rest round to 0 or +-1), ties of x / d at .5, and plain normal values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    x[0, :32] = 0
    x[0, 32] = 1e4
    if K >= 96:
        x[-1, 64:96] = (torch.arange(32) - 16) / 8   # with 31.75, d = 0.25: x / d = k / 2,
        x[-1, 64] = 31.75                            # ties to round to even
    return x


def _extreme_q8_0(rows: int, cols: int):
    """A Q8_0 tensor whose quants include -128 (the sign trick's one corner)."""
    qt = kept("Q8_0", rows, cols, seed=5)
    blocks = qt.data.view(rows, -1, 34)
    blocks[:, :, 2] = 128                         # int8 -128
    blocks[:, :, 3] = 127
    return qt


def _check(lib, fmt: str, qt, x: torch.Tensor) -> None:
    M, K = x.shape
    N = qt.shape[0]
    q = torch.empty(M, K, dtype=torch.int8)
    ds = torch.empty(M, K // 32, 2)
    lib.ckq_quantize_q8(x.data_ptr(), M, K, q.data_ptr(), ds.data_ptr())
    mq, mds = q8_model.quantize(x.numpy())
    assert np.array_equal(q.numpy(), mq) and np.array_equal(ds.numpy(), mds)
    y = torch.empty(M, N)
    assert lib.ckq_gemv_q8(cpu.FORMATS[fmt][0], qt.data.data_ptr(), qt.data.stride(0), N, K,
                           q.data_ptr(), ds.data_ptr(), M, y.data_ptr(), 1) == 0
    assert np.array_equal(y.numpy(), q8_model.gemv(fmt, qt.data.numpy(), mq, mds))


@needs_cc
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("M,N,K", [(1, 37, 96), (3, 8, 576)])
def test_integer_dot_equals_its_numpy_model(fmt, M, N, K):
    _check(cpu.library.load(), fmt, kept(fmt, N, K, seed=3), _x(M, K))


@needs_cc
def test_q8_0_weights_of_minus_128():
    _check(cpu.library.load(), "Q8_0", _extreme_q8_0(9, 128), _x(2, 128))


@needs_cc
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 flags")
def test_the_scalar_build_gives_the_same_bits():
    """cpu.c without AVX2 (the portable loops) makes the same integers and floats."""
    flags = [f if f != "-march=native" else "-march=x86-64" for f in cpu._FLAGS]
    lib = cbuild.build(cpu._SRC, flags, "ckq-scalar")
    cpu._bind(lib)
    for fmt in FORMATS:
        _check(lib, fmt, kept(fmt, 13, 96, seed=4), _x(2, 96, seed=1))
    _check(lib, "Q8_0", _extreme_q8_0(5, 64), _x(1, 64))


@needs_cc
@pytest.mark.parametrize("fmt", FORMATS)
def test_matmul_takes_the_integer_path_for_any_step(fmt):
    """Any number of rows (decode, a speculative check, a prefill chunk): each row's
    product is its own, the same in a step of any size (a restored prefix's next tokens
    equal an uncached prefill's)."""
    qt = kept(fmt, 21, 128, seed=6)
    bias = torch.randn(21)
    x = _x(cpu.GEMV_ROWS + 7, 128, seed=1)
    want = q8_model.gemv(fmt, qt.data.numpy(), *q8_model.quantize(x.numpy()))
    for M in (1, 2, 5, len(x)):
        got = cpu.matmul(x[-M:], qt, activations="q8")
        assert np.array_equal(got.numpy(), want[-M:])
        assert torch.equal(cpu.matmul(x[-M:], qt, bias, activations="q8"), got + bias)


@needs_cc
def test_other_formats_stay_fp32_under_q8():
    for fmt in ("Q4_K", "Q6_K", "F16"):
        qt = kept(fmt, 8, 256, seed=2)
        x = _x(1, 256)
        assert torch.equal(cpu.matmul(x, qt, activations="q8"), cpu.matmul(x, qt))


@needs_cc
def test_a_fused_matmul_quantizes_its_input_once_for_every_part():
    """KeptMatmul's parts of two formats (q/k/v of a mixed file): each part equals its own
    integer product of the same x, quantized once (the second part reuses it)."""
    a, b = kept("Q4_1", 12, 64, seed=1), kept("Q8_0", 5, 64, seed=2)
    mm = KeptMatmul([a, b], None)
    mm.activations = "q8"
    x = _x(2, 64)
    calls = []
    quantize = cpu.library.lib.ckq_matmul_q8

    def spy(*args):
        calls.append(args[9])                 # the `quantize` flag
        return quantize(*args)

    cpu.library.lib.ckq_matmul_q8 = spy
    try:
        y = mm(x)
    finally:
        cpu.library.lib.ckq_matmul_q8 = quantize
    q, ds = q8_model.quantize(x.numpy())
    want = np.concatenate([q8_model.gemv("Q4_1", a.data.numpy(), q, ds),
                           q8_model.gemv("Q8_0", b.data.numpy(), q, ds)], axis=1)
    assert np.array_equal(y.numpy(), want) and calls == [1, 0]

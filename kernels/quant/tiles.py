"""Weight tiles for the Triton matmuls: `weight_tile` reads element (row n, column k) of
a weight, either a plain torch tensor (KEPT false) or a kept GGUF tensor, with the
formulas of formats.py (ggml's dequantize_row_*): the block b = k // BS at byte
n * row_bytes + b * TS, then the format's scale, min and bits for position k % BS.

A kept tensor's format is a runtime argument (its GGML type id, kernels/quant/formats.py),
so one compiled kernel reads every format: a Q4_K_M file's Q4_K, Q6_K and Q8_0 tensors
share it (one JIT at the first request, one compile per target in the compile gate).
The branch is the same for a whole program, and each branch has its block size and
bytes per block as literals. On a GPU the compiler may contract d * q + m into an fma,
so values can differ from the reference in the last bit; under the interpreter they do
not.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _f16(p):
    bits = tl.load(p).to(tl.uint16) | (tl.load(p + 1).to(tl.uint16) << 8)
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _u8(p):
    return tl.load(p).to(tl.int32)


@triton.jit
def _k_scale(sc, s):
    """Q4_K / Q5_K sub-block s's (scale, min) from the 12 scale bytes at sc."""
    lo = s < 4
    s4 = tl.where(lo, s, s - 4)
    a = _u8(sc + s4)                         # q[j] / q[j - 4]
    b = _u8(sc + s4 + 4)                     # q[j + 4]
    c = _u8(sc + tl.where(lo, s4, s4 + 8))   # q[j + 4] for j >= 4 is byte j + 4 = s4 + 8
    d_hi = _u8(sc + s4 + 4 * (1 - lo.to(tl.int32)))   # q[j] for the min's high bits
    scale = tl.where(lo, a & 63, (c & 0xF) | ((a >> 6) << 4))
    mn = tl.where(lo, b & 63, (c >> 4) | ((d_hi >> 6) << 4))
    return scale.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _block(w, row_bytes, n, k, mask, BS: tl.constexpr, TS: tl.constexpr):
    """(block base pointers, position in the block) of elements (n, k); padded lanes read
    block 0 of row 0, which always exists."""
    base = w + n * row_bytes + (k // BS) * TS
    return tl.where(mask, base, w), k % BS


@triton.jit
def weight_tile(w, row_bytes, n, k, mask, fmt, KEPT: tl.constexpr):
    """fp32 values of a weight at rows n [1, BN] x columns k [BK, 1] -> [BK, BN]. Plain
    (not KEPT): w is a torch tensor's typed pointer and row_bytes its row stride in
    elements. KEPT: w points at a kept tensor's bytes, in format `fmt` (a GGML id)."""
    if not KEPT:
        v = tl.load(w + n * row_bytes + k, mask=mask, other=0.).to(tl.float32)
    elif fmt == 1 or fmt == 30:                     # F16 / BF16
        p = w + n * row_bytes + 2 * k
        lo = tl.load(p, mask=mask, other=0).to(tl.uint16)
        hi = tl.load(p + 1, mask=mask, other=0).to(tl.uint16)
        bits = lo | (hi << 8)
        if fmt == 1:
            v = bits.to(tl.float16, bitcast=True).to(tl.float32)
        else:
            v = (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    elif fmt == 2:                                  # Q4_0
        base, j = _block(w, row_bytes, n, k, mask, 32, 18)
        q = (_u8(base + 2 + j % 16) >> (4 * (j // 16))) & 0xF
        v = _f16(base) * (q - 8).to(tl.float32)
    elif fmt == 3:                                  # Q4_1
        base, j = _block(w, row_bytes, n, k, mask, 32, 20)
        q = (_u8(base + 4 + j % 16) >> (4 * (j // 16))) & 0xF
        v = _f16(base) * q.to(tl.float32) + _f16(base + 2)
    elif fmt == 8:                                  # Q8_0
        base, j = _block(w, row_bytes, n, k, mask, 32, 34)
        v = tl.load(base + 2 + j).to(tl.int8, bitcast=True).to(tl.float32) * _f16(base)
    elif fmt == 12:                                 # Q4_K
        base, j = _block(w, row_bytes, n, k, mask, 256, 144)
        sc, mn = _k_scale(base + 4, j // 32)
        within = j % 64
        q = (_u8(base + 16 + 32 * (j // 64) + within % 32) >> (4 * (within // 32))) & 0xF
        v = (_f16(base) * sc) * q.to(tl.float32) - _f16(base + 2) * mn
    elif fmt == 13:                                 # Q5_K
        base, j = _block(w, row_bytes, n, k, mask, 256, 176)
        s = j // 32
        sc, mn = _k_scale(base + 4, s)
        within = j % 64
        ql = _u8(base + 48 + 32 * (j // 64) + within % 32)
        qh = _u8(base + 16 + within % 32)
        q = ((ql >> (4 * (within // 32))) & 0xF) | (((qh >> s) & 1) << 4)
        v = (_f16(base) * sc) * q.to(tl.float32) - _f16(base + 2) * mn
    else:                                           # Q6_K (14)
        base, j = _block(w, row_bytes, n, k, mask, 256, 210)
        h = j // 128
        g = (j % 128) // 32
        li = j % 32
        ql = _u8(base + 64 * h + li + 32 * (g & 1))
        qh = _u8(base + 128 + 32 * h + li)
        q = (((ql >> (4 * (g >> 1))) & 0xF) | (((qh >> (2 * g)) & 3) << 4)) - 32
        sc6 = tl.load(base + 192 + 8 * h + li // 16 + 2 * g).to(tl.int8, bitcast=True)
        v = (_f16(base + 208) * sc6.to(tl.float32)) * q.to(tl.float32)
    return tl.where(mask, v, 0.)

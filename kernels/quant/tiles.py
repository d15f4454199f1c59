"""Weight tiles for the Triton matmuls: `weight_tile` reads element (row n, column k) of
a weight, either a plain torch tensor (DENSE) or a kept GGUF tensor, with the formulas of
formats.py (ggml's dequantize_row_*): the block b = k // BS at byte n * row_bytes +
b * TS, then the format's scale, min and bits for position k % BS. On a GPU the
compiler may contract d * q + m into an fma, so values can differ from the reference
in the last bit; under the interpreter they do not.
"""

from __future__ import annotations

import triton
import triton.language as tl

# ggml's id of F32: the weight is a torch tensor of any float dtype, read as is
DENSE = 0
_DENSE = tl.constexpr(DENSE)        # the same, for the jitted code


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
def weight_tile(w, row_bytes, n, k, mask, FMT: tl.constexpr, BS: tl.constexpr,
                 TS: tl.constexpr):
    """fp32 values of a weight at rows n [1, BN] x columns k [BK, 1] -> [BK, BN]. FMT
    DENSE: w is a torch tensor's typed pointer and row_bytes its row stride in elements;
    otherwise w points at a kept tensor's bytes."""
    if FMT == _DENSE:
        v = tl.load(w + n * row_bytes + k, mask=mask, other=0.).to(tl.float32)
    elif FMT == 1 or FMT == 30:                     # F16 / BF16
        p = w + n * row_bytes + 2 * k
        lo = tl.load(p, mask=mask, other=0).to(tl.uint16)
        hi = tl.load(p + 1, mask=mask, other=0).to(tl.uint16)
        bits = lo | (hi << 8)
        if FMT == 1:
            v = bits.to(tl.float16, bitcast=True).to(tl.float32)
        else:
            v = (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        base = w + n * row_bytes + (k // BS) * TS
        j = k % BS
        # padded lanes read block 0 of row 0, which always exists
        base = tl.where(mask, base, w)
        if FMT == 2:                                # Q4_0
            q = (_u8(base + 2 + j % 16) >> (4 * (j // 16))) & 0xF
            v = _f16(base) * (q - 8).to(tl.float32)
        elif FMT == 3:                              # Q4_1
            q = (_u8(base + 4 + j % 16) >> (4 * (j // 16))) & 0xF
            v = _f16(base) * q.to(tl.float32) + _f16(base + 2)
        elif FMT == 8:                              # Q8_0
            q = tl.load(base + 2 + j).to(tl.int8, bitcast=True).to(tl.float32)
            v = q * _f16(base)
        elif FMT == 12 or FMT == 13:                # Q4_K / Q5_K
            s = j // 32
            sc, mn = _k_scale(base + 4, s)
            within = j % 64
            if FMT == 12:
                ql = _u8(base + 16 + 32 * (j // 64) + within % 32)
                q = (ql >> (4 * (within // 32))) & 0xF
            else:
                ql = _u8(base + 48 + 32 * (j // 64) + within % 32)
                qh = _u8(base + 16 + within % 32)
                q = ((ql >> (4 * (within // 32))) & 0xF) | (((qh >> s) & 1) << 4)
            v = (_f16(base) * sc) * q.to(tl.float32) - _f16(base + 2) * mn
        else:                                       # Q6_K
            h = j // 128
            g = (j % 128) // 32
            li = j % 32
            ql = _u8(base + 64 * h + li + 32 * (g & 1))
            qh = _u8(base + 128 + 32 * h + li)
            q = (((ql >> (4 * (g >> 1))) & 0xF) | (((qh >> (2 * g)) & 3) << 4)) - 32
            sc = tl.load(base + 192 + 8 * h + li // 16 + 2 * g).to(tl.int8, bitcast=True)
            v = (_f16(base + 208) * sc.to(tl.float32)) * q.to(tl.float32)
    return tl.where(mask, v, 0.)

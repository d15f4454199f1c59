"""Kept (GGUF-format) weights in Triton: every program dequantizes the weight tiles it
multiplies, in registers, from the stored bytes; no fp32 copy of a weight is made.

    matmul(x, qt, bias)                  x [M, K] @ W.T, W [N, K] kept     -> [M, N]
    moe_experts(x, ids, w, gate, up, down)   kernels/moe/triton_moe.py's grouped GEMM
                                         over kept experts (gate, up [E, I, H] may
                                         differ in format; down [E, H, I])

`_weight_tile` reads element (row n, column k) of a kept tensor with the formulas of
naive.py (ggml's dequantize_row_*): the block b = k // BS at byte n * row_bytes +
b * TS, then the format's scale, min and bits for position k % BS. On a GPU the
compiler may contract d * q + m into an fma, so values can differ from the reference
in the last bit; under the interpreter they do not.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels.moe.triton_moe import _align
from ckptd.kernels.quant.formats import FORMATS, QuantTensor


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
def _weight_tile(w, row_bytes, n, k, mask, FMT: tl.constexpr, BS: tl.constexpr,
                 TS: tl.constexpr):
    """fp32 values of a kept tensor at rows n [1, BN] x columns k [BK, 1] -> [BK, BN]."""
    if FMT == 1 or FMT == 30:                       # F16 / BF16
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


@triton.jit
def _matmul_kernel(x, w, y, bias, M, N, K, row_bytes, stride_xm, stride_ym,
                   HAS_BIAS: tl.constexpr, FMT: tl.constexpr, BS: tl.constexpr,
                   TS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   PREC: tl.constexpr):
    i_m = tl.program_id(0)
    i_n = tl.program_id(1)
    m = i_m * BM + tl.arange(0, BM)
    n = i_n * BN + tl.arange(0, BN)
    mm, mn = m < M, n < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        mk = k < K
        a = tl.load(x + m[:, None].to(tl.int64) * stride_xm + k[None, :],
                    mask=mm[:, None] & mk[None, :], other=0.).to(tl.float32)
        b = _weight_tile(w, row_bytes, n[None, :].to(tl.int64), k[:, None].to(tl.int64),
                         mk[:, None] & mn[None, :], FMT, BS, TS)
        acc += tl.dot(a, b, input_precision=PREC)
    if HAS_BIAS:
        acc += tl.load(bias + n, mask=mn, other=0.).to(tl.float32)[None, :]
    tl.store(y + m[:, None].to(tl.int64) * stride_ym + n[None, :], acc.to(y.dtype.element_ty),
             mask=mm[:, None] & mn[None, :])


def _blocks(x: torch.Tensor, M: int, N: int, K: int) -> tuple[int, int, int]:
    cpu = x.device.type == "cpu"
    # the interpreter pays per operation, not per element: bigger blocks on the CPU
    BM = max(16, min(64, triton.next_power_of_2(M)))
    BN = max(16, min(128 if cpu else 64, triton.next_power_of_2(N)))
    BK = max(32, min(128 if cpu else 64, triton.next_power_of_2(K)))
    return BM, BN, BK


def _prec(x: torch.Tensor) -> str:
    return "ieee" if x.dtype == torch.float32 else "tf32"


def matmul(x: torch.Tensor, qt: QuantTensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W.T (+ bias) -> [M, N] in x's dtype; W [N, K] kept."""
    if x.dim() != 2 or qt.data.dim() != 2 or x.shape[1] != qt.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} does not fit a kept weight {qt.shape}")
    x = x.contiguous()
    data = qt.data.contiguous()
    M, K = x.shape
    N = qt.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    fmt, bs, ts = FORMATS[qt.fmt]
    BM, BN, BK = _blocks(x, M, N, K)
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    _matmul_kernel[grid](x, data, y, bias if bias is not None else y, M, N, K,
                         data.stride(0), x.stride(0), y.stride(0), HAS_BIAS=bias is not None,
                         FMT=fmt, BS=bs, TS=ts, BM=BM, BN=BN, BK=BK, PREC=_prec(x))
    return y


@triton.jit
def _grouped_kernel(a, w, w2, c, slot_ids, block_expert, weights, n_slots, top_k, N, K,
                    stride_am, stride_we, stride_we2, row_bytes, row_bytes2, stride_cm,
                    SWIGLU: tl.constexpr, GATHER: tl.constexpr, WEIGHTED: tl.constexpr,
                    FMT: tl.constexpr, BS: tl.constexpr, TS: tl.constexpr,
                    FMT2: tl.constexpr, BS2: tl.constexpr, TS2: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """triton_moe's grouped GEMM with kept weights; with SWIGLU, w is gate [E, N, K]
    and w2 up (format FMT2), and silu(gate) * up is stored."""
    i_m = tl.program_id(0)
    i_n = tl.program_id(1)
    e = tl.load(block_expert + i_m).to(tl.int64)
    if e < 0:
        return
    rows = tl.load(slot_ids + i_m * BM + tl.arange(0, BM)).to(tl.int64)
    valid = rows < n_slots
    a_rows = rows // top_k if GATHER else rows
    n = i_n * BN + tl.arange(0, BN)
    mn = n < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc_up = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        mk = kk < K
        b_a = tl.load(a + a_rows[:, None] * stride_am + kk[None, :],
                      mask=valid[:, None] & mk[None, :], other=0.).to(tl.float32)
        m_w = mk[:, None] & mn[None, :]
        b_w = _weight_tile(w + e * stride_we, row_bytes, n[None, :].to(tl.int64),
                           kk[:, None].to(tl.int64), m_w, FMT, BS, TS)
        acc += tl.dot(b_a, b_w, input_precision=PREC)
        if SWIGLU:
            b_u = _weight_tile(w2 + e * stride_we2, row_bytes2, n[None, :].to(tl.int64),
                               kk[:, None].to(tl.int64), m_w, FMT2, BS2, TS2)
            acc_up += tl.dot(b_a, b_u, input_precision=PREC)
    if SWIGLU:
        acc = acc / (1. + tl.exp(-acc)) * acc_up
    if WEIGHTED:
        acc *= tl.load(weights + rows, mask=valid, other=0.).to(tl.float32)[:, None]
    tl.store(c + rows[:, None] * stride_cm + n[None, :], acc.to(c.dtype.element_ty),
             mask=valid[:, None] & mn[None, :])


def moe_experts(x, topk_ids, topk_w, gate: QuantTensor, up: QuantTensor, down: QuantTensor,
                block_m: int | None = None):
    """x [N, H]; topk_ids, topk_w [N, k]; gate, up kept [E, I, H]; down kept [E, H, I].
    Returns [N, H] (kernels/quant/naive.py: moe_experts)."""
    N, k = topk_ids.shape
    E, inter, H = gate.shape
    if tuple(up.shape) != (E, inter, H) or tuple(down.shape) != (E, H, inter) \
            or x.shape[-1] != H:
        raise ValueError(f"kept experts gate {gate.shape} / up {up.shape} / down "
                         f"{down.shape} do not fit x {tuple(x.shape)}")
    if N == 0:
        return torch.zeros_like(x)
    x = x.contiguous()
    g, u, d = (t.data.contiguous() for t in (gate, up, down))
    BM = block_m or max(16, min(64, triton.next_power_of_2(triton.cdiv(N * k, E))))
    slot_ids, block_expert = _align(topk_ids.to(x.device), E, BM)
    weights = topk_w.reshape(-1).to(x.device, torch.float32).contiguous()
    h = torch.empty(N * k, inter, dtype=x.dtype, device=x.device)
    y = torch.empty(N * k, H, dtype=x.dtype, device=x.device)
    for a, (w, qw), (w2, qw2), c, n_out, swiglu in (
            (x, (g, gate), (u, up), h, inter, True),
            (h, (d, down), (d, down), y, H, False)):
        fmt, bs, ts = FORMATS[qw.fmt]
        fmt2, bs2, ts2 = FORMATS[qw2.fmt]
        _, BN, BK = _blocks(x, BM, n_out, a.shape[1])
        grid = (block_expert.numel(), triton.cdiv(n_out, BN))
        _grouped_kernel[grid](
            a, w, w2, c, slot_ids, block_expert, weights, c.shape[0], k, n_out, a.shape[1],
            a.stride(0), w.stride(0), w2.stride(0), w.stride(1), w2.stride(1), c.stride(0),
            SWIGLU=swiglu, GATHER=swiglu, WEIGHTED=not swiglu, FMT=fmt, BS=bs, TS=ts,
            FMT2=fmt2, BS2=bs2, TS2=ts2, BM=BM, BN=BN, BK=BK, PREC=_prec(x))
    return y.view(N, k, H).sum(dim=1)

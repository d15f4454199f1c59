"""Kept (GGUF-format) weights at decode sizes: a GEMV over whole GGUF blocks, for 1..8 rows
of activations, and the kept experts of a decode step's few tokens.

    matmul(x, qt, bias)                      x [M <= 8, K] @ W.T, W [N, K] kept -> [M, N]
    moe_experts(x, ids, w, gate, up, down)   each (token, expert) pair's gate/up GEMV with
                                             SwiGLU, then its down GEMV, weighted, summed

At batch 1 a kept matmul reads the weight once and multiplies each value once: the work is
the read. triton_quant.py's tiled GEMM pads M to a tl.dot tile and takes the format as a
runtime argument (every tile branches over formats); here the format is a constexpr (one
compile per format), a program owns BN output rows and walks K in steps of 256 values (one
K-quant block, or eight 32-value blocks), loading each step's quant bytes in runs of 16
([BN, 8, 16] tiles, contiguous within a block: 16-byte loads for Q4_K / Q5_K, whose
blocks keep 16-byte alignment, 4- or 2-byte for the others), dequantizing in registers,
and summing value * activation in fp32 (no tensor-core tile to fill; one row's products
summed in place and reduced once at the end). Each step yields two
halves of 128 values (a byte's low and high nibbles, or a block's two 16-byte halves for
Q8_0) and the columns of x they multiply, so the activations are read once a step.

Where N / BN programs would leave multiprocessors idle (N = 512..4096 on 132 SMs), K is
split (launch.quant_gemv_split): each split writes fp32 partial sums, summed in a second
pass (torch's sum: deterministic, no atomics, no host sync; CUDA-graph safe).

Values: the dequantization is formats.py's (the gguf package's) in the same fp32 operations,
so under the interpreter each weight value is bit-identical to the reference; the sums
differ from the reference's order in the last bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels import launch
from ckptd.kernels.quant.formats import FORMATS, QuantTensor
from ckptd.kernels.quant.tiles import _f16, _k_scale
from ckptd.kernels.quant.triton_quant import check_experts

STEP = 256          # values of K a program takes at once (one K-quant block)
ROWS = 8            # the most activation rows the GEMV takes (a decode step's tokens)
GEMV_FORMATS = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


@triton.jit
def _quants(p, A: tl.constexpr):
    """The bytes at p [BN, 8, 16] (runs of 16 along the last axis); A: what each
    run's first address is a multiple of (0: nothing known), so the compiler may load a
    run in 16-, 4- or 2-byte words instead of byte by byte."""
    if A > 0:
        p = tl.max_contiguous(tl.multiple_of(p, [1, 1, A]), [1, 1, 16])
    return tl.load(p)


@triton.jit
def _halves(row, k0, K, FMT: tl.constexpr, EVEN: tl.constexpr, ALIGNED: tl.constexpr):
    """One step (columns k0 .. k0 + 255) of the rows at `row` ([BN, 1, 1] pointers to the
    rows' bytes): (lo, hi) fp32 values [BN, 8, 16] and their columns (c_lo, c_hi)
    [1, 8, 16] relative to k0. Not EVEN (a 32-value format with K % 256 != 0): the blocks
    past K read the row's first block instead, and their values are zeroed."""
    g = tl.arange(0, 8)[None, :, None]
    lane = tl.arange(0, 16)[None, None, :]
    if FMT == 2 or FMT == 3 or FMT == 8:            # Q4_0, Q4_1, Q8_0: eight 32-value blocks
        if FMT == 2:
            blk = row + (k0 // 32 + g) * 18
        elif FMT == 3:
            blk = row + (k0 // 32 + g) * 20
        else:
            blk = row + (k0 // 32 + g) * 34
        inside = (k0 + 32 * g) < K
        if not EVEN:
            blk = tl.where(inside, blk, row)
        d = _f16(blk)
        if FMT == 8:
            lo = _quants(blk + 2 + lane, 2 * ALIGNED).to(tl.int8, bitcast=True).to(tl.float32) * d
            hi = _quants(blk + 18 + lane, 2 * ALIGNED).to(tl.int8, bitcast=True).to(tl.float32) * d
        elif FMT == 2:
            q = _quants(blk + 2 + lane, 2 * ALIGNED).to(tl.int32)
            lo = d * ((q & 0xF) - 8).to(tl.float32)
            hi = d * ((q >> 4) - 8).to(tl.float32)
        else:
            q = _quants(blk + 4 + lane, 4 * ALIGNED).to(tl.int32)
            mn = _f16(blk + 2)
            lo = d * (q & 0xF).to(tl.float32) + mn
            hi = d * (q >> 4).to(tl.float32) + mn
        if not EVEN:
            lo = tl.where(inside, lo, 0.)
            hi = tl.where(inside, hi, 0.)
        c_lo = 32 * g + lane
        c_hi = c_lo + 16
    elif FMT == 12 or FMT == 13:                    # Q4_K, Q5_K: one 256-value block
        if FMT == 12:
            blk = row + (k0 // 256) * 144
        else:
            blk = row + (k0 // 256) * 176
        c = g // 2                                  # 64-value chunk: sub-blocks 2c, 2c + 1
        within = 16 * (g % 2) + lane                # byte within the chunk's 32
        d = _f16(blk)
        dmin = _f16(blk + 2)
        sc_lo, mn_lo = _k_scale(blk + 4, 2 * c)
        sc_hi, mn_hi = _k_scale(blk + 4, 2 * c + 1)
        if FMT == 12:
            q = _quants(blk + 16 + 16 * g + lane, 16 * ALIGNED).to(tl.int32)
            q_lo = q & 0xF
            q_hi = q >> 4
        else:
            q = _quants(blk + 48 + 16 * g + lane, 16 * ALIGNED).to(tl.int32)
            qh = _quants(blk + 16 + within, 16 * ALIGNED).to(tl.int32)
            q_lo = (q & 0xF) | (((qh >> (2 * c)) & 1) << 4)
            q_hi = (q >> 4) | (((qh >> (2 * c + 1)) & 1) << 4)
        lo = (d * sc_lo) * q_lo.to(tl.float32) - dmin * mn_lo
        hi = (d * sc_hi) * q_hi.to(tl.float32) - dmin * mn_hi
        c_lo = 64 * c + within
        c_hi = c_lo + 32
    else:                                           # Q6_K (14): one 256-value block
        blk = row + (k0 // 256) * 210
        h = g // 4                                  # 128-value half of the block
        part = (g // 2) % 2                         # sub-group (0, 1) of the low nibbles
        li = 16 * (g % 2) + lane
        d = _f16(blk + 208)
        ql = _quants(blk + 16 * g + lane, 2 * ALIGNED).to(tl.int32)
        qh = _quants(blk + 128 + 32 * h + li, 2 * ALIGNED).to(tl.int32)
        scale = blk + 192 + 8 * h + g % 2 + 2 * part
        sc_lo = tl.load(scale).to(tl.int8, bitcast=True).to(tl.float32)
        sc_hi = tl.load(scale + 4).to(tl.int8, bitcast=True).to(tl.float32)
        q_lo = ((ql & 0xF) | (((qh >> (2 * part)) & 3) << 4)) - 32
        q_hi = ((ql >> 4) | (((qh >> (2 * part + 4)) & 3) << 4)) - 32
        lo = (d * sc_lo) * q_lo.to(tl.float32)
        hi = (d * sc_hi) * q_hi.to(tl.float32)
        c_lo = 128 * h + 32 * part + li
        c_hi = c_lo + 64
    return lo, hi, c_lo, c_hi


@triton.jit
def _products(lo, hi, c_lo, c_hi, xp, k0, K):
    """One activation row's products with one step's halves, [BN, 8, 16] unsummed."""
    xl = tl.load(xp + k0 + c_lo, mask=k0 + c_lo < K, other=0.).to(tl.float32)
    xh = tl.load(xp + k0 + c_hi, mask=k0 + c_hi < K, other=0.).to(tl.float32)
    return lo * xl + hi * xh


@triton.jit
def _dot_rows(acc, lo, hi, c_lo, c_hi, xp, stride_xm, M, k0, K, BM: tl.constexpr):
    """acc [BM, BN] += each activation row's sums against one step's halves."""
    rows = tl.arange(0, BM)
    for r in tl.static_range(BM):
        end = K * (r < M).to(tl.int32)            # a spare row (r >= M) reads nothing
        s = tl.sum(tl.sum(_products(lo, hi, c_lo, c_hi, xp + r * stride_xm, k0, end),
                          axis=2), axis=1)        # [BN]
        acc += tl.where(rows[:, None] == r, s[None, :], 0.)
    return acc


@triton.jit
def _gemv_kernel(x, w, w2, y, bias, ids, weights, M, N, K, row_bytes, row_bytes2,
                 stride_we, stride_we2, stride_xm, stride_ys, stride_ym, steps_per, top_k,
                 FMT: tl.constexpr, FMT2: tl.constexpr, EVEN: tl.constexpr,
                 EXPERTS: tl.constexpr, SWIGLU: tl.constexpr, HAS_BIAS: tl.constexpr,
                 ALIGNED: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Program (i_n, i_s, pair): output rows i_n * BN.. over K split i_s. Plain: x's M rows
    against w, into y [splits, M, N] (split i_s's partial sums). EXPERTS: pair's expert
    ids[pair] (w [E, N, row_bytes]); SWIGLU: gate w and up w2 on x's row pair // top_k,
    silu(gate) * up stored at row pair; else (down) x's row pair, scaled by
    weights[pair]."""
    tl.static_assert(BM == 1 or not EXPERTS, "the experts' GEMV takes one row a pair")
    i_n = tl.program_id(0)
    i_s = tl.program_id(1)
    pair = tl.program_id(2)
    n = i_n * BN + tl.arange(0, BN)
    rows_n = tl.minimum(n, N - 1).to(tl.int64)[:, None, None]   # spare rows reread the last
    xp = x
    wp = w
    wp2 = w2
    yp = y + i_s.to(tl.int64) * stride_ys
    if EXPERTS:
        e = tl.load(ids + pair).to(tl.int64)
        wp = w + e * stride_we
        wp2 = w2 + e * stride_we2
        src = pair // top_k if SWIGLU else pair
        xp = x + src.to(tl.int64) * stride_xm
        yp = y + pair.to(tl.int64) * stride_ym
    row = wp + rows_n * row_bytes
    row2 = wp2 + rows_n * row_bytes2
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc_up = tl.zeros((BM, BN), dtype=tl.float32)
    # one row (not SwiGLU's two weights): products summed in place over the steps
    # ([BN, 8, 16], 16 registers a thread) and reduced across the block once at the end,
    # not once a step; SwiGLU's gate and up in place took ~225 registers (sm_90, ptxas)
    one = tl.zeros((BN, 8, 16), dtype=tl.float32)
    first = i_s * steps_per
    last = tl.minimum(first + steps_per, tl.cdiv(K, 256))
    for step in range(first, last):
        k0 = step * 256
        lo, hi, c_lo, c_hi = _halves(row, k0, K, FMT, EVEN, ALIGNED)
        if BM == 1 and not SWIGLU:
            one += _products(lo, hi, c_lo, c_hi, xp, k0, K)
        else:
            acc = _dot_rows(acc, lo, hi, c_lo, c_hi, xp, stride_xm, M, k0, K, BM)
        if SWIGLU:
            lo, hi, c_lo, c_hi = _halves(row2, k0, K, FMT2, EVEN, ALIGNED)
            acc_up = _dot_rows(acc_up, lo, hi, c_lo, c_hi, xp, stride_xm, M, k0, K, BM)
    if BM == 1 and not SWIGLU:
        acc += tl.sum(tl.sum(one, axis=2), axis=1)[None, :]
    if SWIGLU:
        acc = acc / (1. + tl.exp(-acc)) * acc_up
    if EXPERTS and not SWIGLU:
        acc *= tl.load(weights + pair).to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + n, mask=n < N, other=0.).to(tl.float32)[None, :]
    m = tl.arange(0, BM)
    tl.store(yp + m[:, None] * stride_ym + n[None, :], acc.to(y.dtype.element_ty),
             mask=(m[:, None] < M) & (n[None, :] < N))


def takes(x: torch.Tensor, qt: QuantTensor) -> bool:
    """Whether matmul(x, qt) runs here: a decode step's 1..8 rows, a block format."""
    return 1 <= x.shape[0] <= ROWS and qt.fmt in GEMV_FORMATS and qt.data.dim() == 2


def _even(K: int) -> bool:
    return K % STEP == 0


def _aligned(*data: torch.Tensor) -> bool:
    """Every weight's bytes start at a multiple of 16 (a fresh allocation, a GGUF's
    32-aligned tensor, an expert or row slice of one: whole blocks of 16-byte multiples
    for the K-quants); else the kernel assumes nothing of its addresses."""
    return all(d.data_ptr() % 16 == 0 for d in data)


def matmul(x: torch.Tensor, qt: QuantTensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W.T (+ bias) -> [M, N] in x's dtype; W [N, K] kept; M <= 8."""
    if x.dim() != 2 or qt.data.dim() != 2 or x.shape[1] != qt.shape[1] or not takes(x, qt):
        raise ValueError(f"the kept GEMV takes 1..{ROWS} rows and a 2-D {GEMV_FORMATS} "
                         f"weight, got x {tuple(x.shape)}, {qt.fmt} {qt.shape}")
    x = x.contiguous()
    data = qt.data.contiguous()
    M, K = x.shape
    N = qt.shape[0]
    t = launch.target(x.device)
    p = launch.quant_gemv(t, M)
    blocks = triton.cdiv(N, p["BN"])
    steps = triton.cdiv(K, STEP)
    splits = launch.quant_gemv_split(t, blocks, steps)
    per = triton.cdiv(steps, splits)
    splits = triton.cdiv(steps, per)                # no split left without a step
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    out = y if splits == 1 else torch.empty(splits, M, N, dtype=torch.float32,
                                            device=x.device)
    in_kernel = bias is not None and splits == 1
    fmt = FORMATS[qt.fmt][0]
    _gemv_kernel[(blocks, splits, 1)](
        x, data, data, out, bias if in_kernel else out, out, out, M, N, K, data.stride(0),
        data.stride(0), 0, 0, x.stride(0), M * N, N, per, 1, FMT=fmt, FMT2=fmt,
        EVEN=_even(K), EXPERTS=False, SWIGLU=False, HAS_BIAS=in_kernel, ALIGNED=_aligned(data),
        **p.kwargs())
    if splits == 1:
        return y
    total = out.sum(dim=0)
    if bias is not None:
        total += bias.to(torch.float32)
    return total.to(x.dtype)


def takes_experts(x: torch.Tensor, gate: QuantTensor, up: QuantTensor,
                  down: QuantTensor) -> bool:
    """Whether moe_experts runs here: a decode step's few tokens, block formats."""
    return x.shape[0] <= ROWS and all(t.fmt in GEMV_FORMATS for t in (gate, up, down))


def moe_experts(x, topk_ids, topk_w, gate: QuantTensor, up: QuantTensor, down: QuantTensor):
    """x [T, H]; topk_ids, topk_w [T, k]; gate, up kept [E, I, H]; down kept [E, H, I].
    Returns [T, H] (kernels/quant/naive.py: moe_experts). Two launches over the T * k
    (token, expert) pairs, no padding: h = silu(gate x) * up x, then w * down h."""
    T, k = topk_ids.shape
    _, inter, H = check_experts(x, gate, up, down)
    if T == 0:
        return torch.zeros_like(x)
    x = x.contiguous()
    pairs = T * k
    ids = topk_ids.reshape(-1).to(x.device, torch.int32).contiguous()
    weights = topk_w.reshape(-1).to(x.device, torch.float32).contiguous()
    g, u, dn = (t.data.contiguous() for t in (gate, up, down))
    t = launch.target(x.device)
    p = launch.quant_moe_gemv(t)
    h = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(inter, p["BN"]), 1, pairs)](
        x, g, u, h, h, ids, weights, 1, inter, H, g.stride(1), u.stride(1), g.stride(0),
        u.stride(0), x.stride(0), 0, h.stride(0), triton.cdiv(H, STEP), k,
        FMT=FORMATS[gate.fmt][0], FMT2=FORMATS[up.fmt][0], EVEN=_even(H), EXPERTS=True,
        SWIGLU=True, HAS_BIAS=False, ALIGNED=_aligned(g, u), **p.kwargs())
    y = torch.empty(pairs, H, dtype=torch.float32, device=x.device)
    fmt = FORMATS[down.fmt][0]
    _gemv_kernel[(triton.cdiv(H, p["BN"]), 1, pairs)](
        h, dn, dn, y, y, ids, weights, 1, H, inter, dn.stride(1), dn.stride(1), dn.stride(0),
        dn.stride(0), h.stride(0), 0, y.stride(0), triton.cdiv(inter, STEP), k,
        FMT=fmt, FMT2=fmt, EVEN=_even(inter), EXPERTS=True, SWIGLU=False, HAS_BIAS=False,
        ALIGNED=_aligned(dn), **p.kwargs())
    return y.view(T, k, H).sum(dim=1).to(x.dtype)

"""A sparse mixture of experts' expert half in Triton: a grouped GEMM over tokens sorted
by expert (shapes as in naive.py).

The N*k (token, expert) pairs (pair = token * k + j) are sorted by expert and
each expert's run is padded to a multiple of BM rows, so every block of BM rows belongs
to one expert (`_align`, in torch, without a host sync: the block count is bounded by
cdiv(N*k, BM) + min(E, N*k), and blocks past the end carry expert -1). A program takes
one block and BN output columns and multiplies the block's rows by its expert's weight.
Two launches: gate and up with SiLU(gate) * up fused in (rows gathered from x), then
down, scaled by each pair's routing weight; the k pairs of a token are summed last.
The same kernel serves kept (GGUF-format) experts (kernels/quant/triton_quant.py), and
gpt-oss' experts (`moe_experts_clamped`): a bias per expert added to each projection's
fp32 sums, and the clamped SwiGLU in place of SiLU(gate) * up.
An expert that gets no token has no block: its weights are never read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels import launch
from ckptd.kernels.moe.naive import _check
from ckptd.kernels.quant.tiles import weight_tile

DENSE = 0       # a plain weight's "format" in grouped_gemm's (weight, format) tuples


@triton.jit
def _grouped_kernel(a, w, w2, c, pair_ids, block_expert, weights, bias, bias2, n_pairs, top_k,
                    N, K, stride_am, stride_we, stride_we2, row_stride, row_stride2,
                    stride_cm, stride_be, fmt, fmt2, alpha, limit, SWIGLU: tl.constexpr,
                    GATHER: tl.constexpr, WEIGHTED: tl.constexpr, KEPT: tl.constexpr,
                    BIAS: tl.constexpr, CLAMPED: tl.constexpr, BM: tl.constexpr,
                    BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """One block of BM rows (one expert's) times BN output columns. With SWIGLU, w is
    gate [E, N, K] and w2 up, and silu(gate) * up is stored (CLAMPED: gpt-oss'
    (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)).
    BIAS: bias [E, N] (and bias2, up's) added to the sums. Weights are plain or (KEPT)
    in GGUF formats fmt, fmt2 (kernels/quant/tiles.py); their tiles multiply in a's dtype
    (bf16 on tensor cores for a bf16 model), accumulated in fp32."""
    DT = a.dtype.element_ty
    i_m = tl.program_id(0)
    i_n = tl.program_id(1)
    e = tl.load(block_expert + i_m).to(tl.int64)
    if e < 0:
        return
    rows = tl.load(pair_ids + i_m * BM + tl.arange(0, BM)).to(tl.int64)
    valid = rows < n_pairs
    a_rows = rows // top_k if GATHER else rows       # pair -> its token's row of x
    n = i_n * BN + tl.arange(0, BN)
    mn = n < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc_up = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        mk = kk < K
        b_a = tl.load(a + a_rows[:, None] * stride_am + kk[None, :],
                      mask=valid[:, None] & mk[None, :], other=0.)                  # [BM, BK]
        m_w = mk[:, None] & mn[None, :]
        b_w = weight_tile(w + e * stride_we, row_stride, n[None, :].to(tl.int64),
                          kk[:, None].to(tl.int64), m_w, fmt, KEPT).to(DT)          # [BK, BN]
        acc += tl.dot(b_a, b_w, input_precision=PREC)
        if SWIGLU:
            b_u = weight_tile(w2 + e * stride_we2, row_stride2, n[None, :].to(tl.int64),
                              kk[:, None].to(tl.int64), m_w, fmt2, KEPT).to(DT)
            acc_up += tl.dot(b_a, b_u, input_precision=PREC)
    if BIAS:
        acc += tl.load(bias + e * stride_be + n, mask=mn, other=0.).to(tl.float32)[None, :]
        if SWIGLU:
            acc_up += tl.load(bias2 + e * stride_be + n, mask=mn,
                              other=0.).to(tl.float32)[None, :]
    if SWIGLU:
        if CLAMPED:
            g = tl.minimum(acc, limit)
            up = tl.minimum(tl.maximum(acc_up, -limit), limit)
            acc = (up + 1.) * (g / (1. + tl.exp(-alpha * g)))
        else:
            acc = acc / (1. + tl.exp(-acc)) * acc_up
    if WEIGHTED:
        acc *= tl.load(weights + rows, mask=valid, other=0.).to(tl.float32)[:, None]
    tl.store(c + rows[:, None] * stride_cm + n[None, :], acc.to(c.dtype.element_ty),
             mask=valid[:, None] & mn[None, :])


def align(topk_ids: torch.Tensor, n_experts: int, BM: int):
    """(pair_ids [n_blocks * BM], block_expert [n_blocks]) for the grouped GEMM: expert
    e's pairs, in pair order, fill its blocks; padding rows hold n_pairs, spare blocks
    expert -1."""
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    n_pairs = flat.numel()
    n_blocks = triton.cdiv(n_pairs, BM) + min(n_experts, n_pairs)
    order = torch.argsort(flat, stable=True)
    # not bincount: on CUDA it reads the ids' max back to the host (a sync per layer)
    counts = torch.zeros(n_experts, dtype=torch.long, device=dev).scatter_add_(
        0, flat, torch.ones_like(flat))
    starts = torch.cumsum(counts, 0) - counts                     # first sorted pair of e
    padded = (counts + BM - 1) // BM * BM
    padded_ends = torch.cumsum(padded, 0)
    sorted_e = flat[order]
    dest = (padded_ends - padded)[sorted_e] + torch.arange(n_pairs, device=dev) - starts[sorted_e]
    pair_ids = torch.full((n_blocks * BM,), n_pairs, dtype=torch.int32, device=dev)
    pair_ids[dest] = order.to(torch.int32)
    block_start = torch.arange(n_blocks, device=dev) * BM
    block_expert = torch.searchsorted(padded_ends, block_start, right=True)
    block_expert = torch.where(block_expert < n_experts, block_expert, -1).to(torch.int32)
    return pair_ids, block_expert


def grouped_gemm(a, wt, wt2, c, pair_ids, block_expert, weights, top_k, n_out, BM, *,
                 swiglu: bool, bias=None, bias2=None, clamp: tuple[float, float] | None = None
                 ) -> None:
    """c = the experts' a @ W.T over align()'s blocks. wt, wt2: (weight [E, n_out, K],
    GGML format id), a plain tensor with DENSE or a kept tensor's bytes. swiglu: a is x
    (rows gathered per pair), wt gate and wt2 up; else a is h, and the rows are scaled
    by the pairs' routing weights. bias, bias2: [E, n_out] per expert (wt's, wt2's) or
    None; clamp: (alpha, limit) of the clamped SwiGLU, or None for SiLU(gate) * up."""
    (w, fmt), (w2, fmt2) = wt, wt2
    K = a.shape[1]
    if fmt == DENSE and w.dtype != a.dtype:
        raise ValueError(f"plain expert weights must be in the activations' dtype {a.dtype}, "
                         f"got {w.dtype}")
    p = launch.grouped_gemm(launch.target(a.device), BM, a.dtype, kept=fmt != DENSE)
    grid = (block_expert.numel(), triton.cdiv(n_out, p["BN"]))
    # without biases the routing weights stand in (never read): the pointer types stay
    b1 = weights if bias is None else bias
    b2 = b1 if bias2 is None else bias2
    alpha, limit = clamp or (1.0, 1.0)
    _grouped_kernel[grid](
        a, w, w2, c, pair_ids, block_expert, weights, b1, b2, c.shape[0], top_k, n_out, K,
        a.stride(0), w.stride(0), w2.stride(0), w.stride(1), w2.stride(1), c.stride(0),
        b1.stride(0), fmt, fmt2, float(alpha), float(limit), SWIGLU=swiglu, GATHER=swiglu,
        WEIGHTED=not swiglu, KEPT=fmt != DENSE, BIAS=bias is not None,
        CLAMPED=clamp is not None, **p.kwargs())


def moe_experts(x, topk_ids, topk_w, w_gate_up, w_down, block_m: int | None = None, *,
                biases=None, clamp: tuple[float, float] | None = None):
    """x [N, H]; topk_ids, topk_w [N, k]; w_gate_up [E, 2I, H]; w_down [E, H, I].
    Returns [N, H] (see naive.py). block_m: rows per block (default: launch.grouped_rows,
    from the rows per expert). biases: (b_gate_up [E, 2I], b_down [E, H]) or None; clamp:
    the clamped SwiGLU's (alpha, limit) (moe_experts_clamped)."""
    _check(x, topk_ids, topk_w, w_gate_up, w_down)
    N, k = topk_ids.shape
    E, two_i, H = w_gate_up.shape
    if N == 0:
        return torch.zeros_like(x)
    x, w_gate_up, w_down = x.contiguous(), w_gate_up.contiguous(), w_down.contiguous()
    BM = block_m or launch.grouped_rows(N * k, E)
    pair_ids, block_expert = align(topk_ids.to(x.device), E, BM)
    weights = topk_w.reshape(-1).to(x.device, torch.float32).contiguous()
    inter = two_i // 2
    gate, up = (w_gate_up[:, :inter], DENSE), (w_gate_up[:, inter:], DENSE)
    b_gate = b_up = b_down = None
    if biases is not None:
        b_gate_up, b_down = (b.to(x.dtype).contiguous() for b in biases)
        b_gate, b_up = b_gate_up[:, :inter], b_gate_up[:, inter:]
    h = torch.empty(N * k, inter, dtype=x.dtype, device=x.device)
    grouped_gemm(x, gate, up, h, pair_ids, block_expert, weights, k, inter, BM, swiglu=True,
                 bias=b_gate, bias2=b_up, clamp=clamp)
    y = torch.empty(N * k, H, dtype=x.dtype, device=x.device)
    down = (w_down, DENSE)
    grouped_gemm(h, down, down, y, pair_ids, block_expert, weights, k, H, BM, swiglu=False,
                 bias=b_down)
    return y.view(N, k, H).sum(dim=1)


def moe_experts_clamped(x, topk_ids, topk_w, w_gate_up, b_gate_up, w_down, b_down,
                        alpha: float, limit: float):
    """gpt-oss' experts (naive.moe_experts_clamped): biases and the clamped SwiGLU."""
    return moe_experts(x, topk_ids, topk_w, w_gate_up, w_down, biases=(b_gate_up, b_down),
                       clamp=(alpha, limit))

"""A sparse mixture of experts' expert half in Triton: a grouped GEMM over tokens sorted
by expert (shapes as in naive.py).

The N*k (token, expert) pairs ("slots", slot = token * k + j) are sorted by expert and
each expert's run is padded to a multiple of BM rows, so every block of BM rows belongs
to one expert (`_align`, in torch, without a host sync: the block count is bounded by
cdiv(N*k, BM) + min(E, N*k), and blocks past the end carry expert -1). A program takes
one block and BN output columns and multiplies the block's rows by its expert's weight.
Two launches: gate_up with SiLU(gate) * up fused in (rows gathered from x), then down,
scaled by each slot's routing weight; the k slots of a token are summed last.
An expert that gets no token has no block: its weights are never read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels.moe.naive import _check


@triton.jit
def _grouped_gemm_kernel(a, w, c, slot_ids, block_expert, weights, n_slots, top_k, N, K,
                         stride_am, stride_we, stride_wn, stride_cm,
                         SWIGLU: tl.constexpr, GATHER: tl.constexpr, WEIGHTED: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                         PREC: tl.constexpr):
    i_m = tl.program_id(0)
    i_n = tl.program_id(1)
    e = tl.load(block_expert + i_m).to(tl.int64)
    if e < 0:
        return
    rows = tl.load(slot_ids + i_m * BM + tl.arange(0, BM)).to(tl.int64)
    valid = rows < n_slots
    if GATHER:
        a_rows = rows // top_k              # slot -> its token's row of x
    else:
        a_rows = rows
    n = i_n * BN + tl.arange(0, BN)
    mn = n < N
    p_w = w + e * stride_we
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc_up = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        mk = kk < K
        b_a = tl.load(a + a_rows[:, None] * stride_am + kk[None, :],
                      mask=valid[:, None] & mk[None, :], other=0.).to(tl.float32)   # [BM, BK]
        m_w = mk[:, None] & mn[None, :]
        b_w = tl.load(p_w + n[None, :] * stride_wn + kk[:, None], mask=m_w,
                      other=0.).to(tl.float32)                                       # [BK, BN]
        acc += tl.dot(b_a, b_w, input_precision=PREC)
        if SWIGLU:
            # the up_proj rows sit N rows below the gate_proj rows
            b_u = tl.load(p_w + (n + N)[None, :] * stride_wn + kk[:, None], mask=m_w,
                          other=0.).to(tl.float32)
            acc_up += tl.dot(b_a, b_u, input_precision=PREC)
    if SWIGLU:
        acc = acc / (1. + tl.exp(-acc)) * acc_up
    if WEIGHTED:
        acc *= tl.load(weights + rows, mask=valid, other=0.).to(tl.float32)[:, None]
    tl.store(c + rows[:, None] * stride_cm + n[None, :], acc.to(c.dtype.element_ty),
             mask=valid[:, None] & mn[None, :])


def _align(topk_ids: torch.Tensor, n_experts: int, BM: int):
    """(slot_ids [n_blocks * BM], block_expert [n_blocks]) for the grouped GEMM: expert
    e's slots, in slot order, fill its blocks; padding rows hold n_slots, spare blocks
    expert -1."""
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    n_slots = flat.numel()
    n_blocks = triton.cdiv(n_slots, BM) + min(n_experts, n_slots)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n_experts)
    starts = torch.cumsum(counts, 0) - counts                     # first sorted pair of e
    padded = (counts + BM - 1) // BM * BM
    padded_ends = torch.cumsum(padded, 0)
    sorted_e = flat[order]
    dest = (padded_ends - padded)[sorted_e] + torch.arange(n_slots, device=dev) - starts[sorted_e]
    slot_ids = torch.full((n_blocks * BM,), n_slots, dtype=torch.int32, device=dev)
    slot_ids[dest] = order.to(torch.int32)
    block_start = torch.arange(n_blocks, device=dev) * BM
    block_expert = torch.searchsorted(padded_ends, block_start, right=True)
    block_expert = torch.where(block_expert < n_experts, block_expert, -1).to(torch.int32)
    return slot_ids, block_expert


def _launch(a, w, c, slot_ids, block_expert, weights, top_k, n_out, BM, *, swiglu, gather,
            weighted):
    K = a.shape[1]
    cpu = a.device.type == "cpu"
    # the interpreter pays per operation, not per element: bigger blocks on the CPU
    BN = max(16, min(128 if cpu else 64, triton.next_power_of_2(n_out)))
    BK = max(16, min(128 if cpu else 64, triton.next_power_of_2(K)))
    prec = "ieee" if a.dtype == torch.float32 and w.dtype == torch.float32 else "tf32"
    grid = (block_expert.numel(), triton.cdiv(n_out, BN))
    _grouped_gemm_kernel[grid](
        a, w, c, slot_ids, block_expert, weights, c.shape[0], top_k, n_out, K,
        a.stride(0), w.stride(0), w.stride(1), c.stride(0), SWIGLU=swiglu, GATHER=gather,
        WEIGHTED=weighted, BM=BM, BN=BN, BK=BK, PREC=prec)


def moe_experts(x, topk_ids, topk_w, w_gate_up, w_down, block_m: int | None = None):
    """x [N, H]; topk_ids, topk_w [N, k]; w_gate_up [E, 2I, H]; w_down [E, H, I].
    Returns [N, H] (see naive.py). block_m: rows per block (default: from the mean rows
    per expert, 16 to 64)."""
    _check(x, topk_ids, topk_w, w_gate_up, w_down)
    N, k = topk_ids.shape
    E, two_i, H = w_gate_up.shape
    if N == 0:
        return torch.zeros_like(x)
    x, w_gate_up, w_down = x.contiguous(), w_gate_up.contiguous(), w_down.contiguous()
    # rows per block near the mean rows per expert: a decode step's one or two, a long
    # prefill chunk's many (fewer, fuller blocks)
    BM = block_m or max(16, min(64, triton.next_power_of_2(triton.cdiv(N * k, E))))
    slot_ids, block_expert = _align(topk_ids.to(x.device), E, BM)
    weights = topk_w.reshape(-1).to(x.device, torch.float32).contiguous()
    h = torch.empty(N * k, two_i // 2, dtype=x.dtype, device=x.device)
    _launch(x, w_gate_up, h, slot_ids, block_expert, weights, k, two_i // 2, BM, swiglu=True,
            gather=True, weighted=False)
    y = torch.empty(N * k, H, dtype=x.dtype, device=x.device)
    _launch(h, w_down, y, slot_ids, block_expert, weights, k, H, BM, swiglu=False,
            gather=False, weighted=True)
    return y.view(N, k, H).sum(dim=1)

"""A sparse mixture of experts' expert half, plain torch: each token's top-k experts,
computed grouped by expert.

    x          [N, H]        the tokens
    topk_ids   [N, k] int    the experts each token is routed to
    topk_w     [N, k]        their weights (already softmaxed / renormalised)
    w_gate_up  [E, 2I, H]    per expert: gate_proj rows then up_proj rows
    w_down     [E, H, I]
    returns    [N, H]        sum_j topk_w[n, j] * down(silu(gate(x_n)) * up(x_n)) of expert
                             topk_ids[n, j]

`moe_experts` sorts the N*k (token, expert) pairs by expert and runs one matmul pair per
expert that received any token: the work is N*k rows, whatever E is. `moe_per_token` is
the definition written out: a loop over tokens and their k experts (tests, benchmarks).
`moe_experts_clamped` is gpt-oss' expert half: biases on both projections and the
clamped SwiGLU in place of silu(gate) * up.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_GROUPED_MM = hasattr(F, "grouped_mm")          # torch >= 2.10
_GROUPED_MM_ROWS = 4096                         # (token, expert) pairs: 512 tokens at top-8


def _check(x, topk_ids, topk_w, w_gate_up, w_down) -> None:
    if x.dim() != 2 or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"x must be [N, H] and topk_ids [N, k], got {tuple(x.shape)}, "
                         f"{tuple(topk_ids.shape)}")
    if topk_w.shape != topk_ids.shape:
        raise ValueError(f"topk_w {tuple(topk_w.shape)} must match topk_ids "
                         f"{tuple(topk_ids.shape)}")
    E, two_i, H = w_gate_up.shape
    if H != x.shape[1] or two_i % 2 or tuple(w_down.shape) != (E, H, two_i // 2):
        raise ValueError(f"w_gate_up {tuple(w_gate_up.shape)} / w_down {tuple(w_down.shape)} "
                         f"do not fit x [N, {x.shape[1]}]")


def moe_experts(x, topk_ids, topk_w, w_gate_up, w_down):
    """Grouped by expert: tokens sorted by expert, one matmul pair per active expert."""
    _check(x, topk_ids, topk_w, w_gate_up, w_down)
    if topk_ids.shape[0] == 0:
        return torch.zeros_like(x)
    counts, token, weight = pairs_by_expert(topk_ids, topk_w, w_gate_up.shape[0], x.dtype)
    if _GROUPED_MM and x.device.type == "cpu" and token.numel() <= _GROUPED_MM_ROWS:
        # One call for all groups (empty ones cost nothing) instead of two per active
        # expert: at decode sizes the per-call cost of torch's threads dominates a loop of
        # F.linear (docs/BENCHMARKS.md). Long prefill chunks take the loop, which works
        # on one expert's rows at a time instead of gathering all N*k rows at once.
        offs = torch.cumsum(counts, 0).to(torch.int32)
        gate, up = F.grouped_mm(x[token], w_gate_up.transpose(-2, -1),
                                offs=offs).chunk(2, dim=-1)
        y = F.grouped_mm(F.silu(gate) * up, w_down.transpose(-2, -1), offs=offs)
        return torch.zeros_like(x).index_add_(0, token, y.mul_(weight))

    def mlp(e: int, xe: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(xe, w_gate_up[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, w_down[e])
    return each_active_expert(x, counts, token, weight, mlp)


def pairs_by_expert(topk_ids, topk_w, num_experts: int, dtype):
    """The N*k token-expert pairs sorted by expert: (pairs per expert [E], the token of
    each pair, its routing weight [N*k, 1] in dtype)."""
    flat = topk_ids.reshape(-1)
    # stable: a token's pairs keep their order within an expert's group
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    return counts, order // topk_ids.shape[1], topk_w.reshape(-1)[order, None].to(dtype)


def each_active_expert(x, counts, token, weight, mlp):
    """sum over each token's experts of weight * mlp(e, its rows of x), one mlp call per
    expert some token chose, on that expert's rows only."""
    out = torch.zeros_like(x)
    start = 0
    for e, n in enumerate(counts.tolist()):
        if n:
            rows = token[start:start + n]
            out.index_add_(0, rows, mlp(e, x[rows]).mul_(weight[start:start + n]))
            start += n
    return out


def clamped_swiglu(gate, up, alpha: float, limit: float):
    """gpt-oss' activation: g = min(gate, limit), (clamp(up, -limit, limit) + 1) *
    g * sigmoid(alpha * g)."""
    g = gate.clamp(max=limit)
    return (up.clamp(-limit, limit) + 1) * (g * torch.sigmoid(g * alpha))


def moe_experts_clamped(x, topk_ids, topk_w, w_gate_up, b_gate_up, w_down, b_down,
                        alpha: float, limit: float):
    """As moe_experts with biases b_gate_up [E, 2I] (gate's, then up's) and b_down [E, H]
    and the clamped SwiGLU (gpt-oss), one matmul pair per active expert."""
    _check(x, topk_ids, topk_w, w_gate_up, w_down)
    if topk_ids.shape[0] == 0:
        return torch.zeros_like(x)
    counts, token, weight = pairs_by_expert(topk_ids, topk_w, w_gate_up.shape[0], x.dtype)

    def mlp(e: int, xe: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(xe, w_gate_up[e], b_gate_up[e]).chunk(2, dim=-1)
        return F.linear(clamped_swiglu(gate, up, alpha, limit), w_down[e], b_down[e])
    return each_active_expert(x, counts, token, weight, mlp)


def moe_per_token(x, topk_ids, topk_w, w_gate_up, w_down):
    """The same sum, token by token and expert by expert (N*k matrix-vector pairs)."""
    _check(x, topk_ids, topk_w, w_gate_up, w_down)
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[n, j])
            gate, up = F.linear(x[n], w_gate_up[e]).chunk(2, dim=-1)
            out[n] += topk_w[n, j].to(x.dtype) * F.linear(F.silu(gate) * up, w_down[e])
    return out

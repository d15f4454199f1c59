"""Step-by-step Mamba2 (SSD) scan in Triton: decode for a batch, or short prefills.

One program per (sequence, block of BH heads, block of BP head_dim rows) keeps
S [BH, BP, N] in registers and walks the sequence's tokens; per token, as in
naive.ssd_recurrent:
    S = S exp(dt A) + dt x B^T;   y = S C + D x
States live in a pool [num_cells, H, P, N] fp32 read and written in place, so a
server's decode step updates its sequences' cells without gathering them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels.mamba2.chunk import Launch, one_sequence, seq_span


@triton.jit
def _ssd_recurrent_kernel(x, dt, A, B, C, D, y, pool, state_idx, cu_seqlens, H, G, stride_x,
                          stride_b, stride_pool, P: tl.constexpr, NS: tl.constexpr,
                          BH: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
                          HAS_D: tl.constexpr):
    i_hb = tl.program_id(1)
    i_p = tl.program_id(2)
    bos, eos, cell = seq_span(cu_seqlens, state_idx, tl.program_id(0))
    ch = i_hb * BH + tl.arange(0, BH)
    cp = i_p * BP + tl.arange(0, BP)
    cn = tl.arange(0, BN)
    mh = ch < H
    cg = ch // (H // G)
    mx = mh[:, None] & (cp < P)[None, :]                                  # [BH, BP]
    mb = mh[:, None] & (cn < NS)[None, :]                                 # [BH, BN]
    a = tl.load(A + ch, mask=mh, other=0.).to(tl.float32)
    d = tl.zeros((BH,), dtype=tl.float32)
    if HAS_D:
        d = tl.load(D + ch, mask=mh, other=0.).to(tl.float32)
    p_s = pool + cell * stride_pool + (ch * P * NS)[:, None, None] \
        + (cp * NS)[None, :, None] + cn[None, None, :]
    m_s = mx[:, :, None] & mb[:, None, :]
    b_s = tl.load(p_s, mask=m_s, other=0.).to(tl.float32)               # [BH, BP, BN]
    # pointers advance by one token per step (loop counters are int32 in the interpreter)
    p_x = x + bos * stride_x + (ch * P)[:, None] + cp[None, :]
    p_y = y + bos * H * P + (ch * P)[:, None] + cp[None, :]
    p_b = B + bos * stride_b + (cg * NS)[:, None] + cn[None, :]
    p_c = C + bos * stride_b + (cg * NS)[:, None] + cn[None, :]
    p_dt = dt + bos * H + ch
    for _ in range(bos, eos):
        b_x = tl.load(p_x, mask=mx, other=0.).to(tl.float32)
        b_dt = tl.load(p_dt, mask=mh, other=0.).to(tl.float32)
        b_b = tl.load(p_b, mask=mb, other=0.).to(tl.float32)
        b_c = tl.load(p_c, mask=mb, other=0.).to(tl.float32)
        b_s = b_s * tl.exp(b_dt * a)[:, None, None] \
            + (b_dt[:, None] * b_x)[:, :, None] * b_b[:, None, :]
        b_y = tl.sum(b_s * b_c[:, None, :], axis=2) + d[:, None] * b_x
        tl.store(p_y, b_y.to(p_y.dtype.element_ty), mask=mx)
        p_x += stride_x
        p_y += H * P
        p_b += stride_b
        p_c += stride_b
        p_dt += H
    tl.debug_barrier()      # every thread has read the initial state before any writes
    tl.store(p_s, b_s, mask=m_s)


def recurrent_launch(cc: int | None, H: int, P: int, N: int, dtype: torch.dtype) -> dict:
    """Launch parameters of _ssd_recurrent_kernel: cc the compute capability, or None for
    the CPU interpreter (all heads and rows in one program: it pays per operation). On a
    GPU one head per program and BP rows of it, the [BP, N] state in registers at 4K
    values, so a decode step of a few sequences still fills the SMs."""
    BN = max(2, triton.next_power_of_2(N))
    if cc is None:
        return {"BH": triton.next_power_of_2(H), "BP": triton.next_power_of_2(P), "BN": BN,
                "num_warps": 4, "num_stages": 1}
    BP = min(triton.next_power_of_2(P), max(1, 4096 // BN))
    return {"BH": 1, "BP": BP, "BN": BN, "num_warps": 4, "num_stages": 1}


def ssd_recurrent_varlen(x, dt, A, B, C, D, cu_seqlens, state_pool, state_indices,
                         heads_per_program=None):
    """Several packed sequences, token by token: arguments and results as
    chunk.ssd_chunk_varlen. heads_per_program (a power of two) overrides the launch
    shape, for tests."""
    run = Launch.of(x, dt, A, B, C, D, cu_seqlens, state_pool, state_indices)
    H, P, N = x.shape[1], x.shape[2], B.shape[2]
    if x.shape[0] == 0:
        return run.y
    lp = recurrent_launch(run.cc, H, P, N, x.dtype)
    if heads_per_program is not None:
        if heads_per_program & (heads_per_program - 1):
            raise ValueError(f"heads_per_program must be a power of two, got {heads_per_program}")
        lp["BH"] = heads_per_program
    grid = (len(run.cu) - 1, triton.cdiv(H, lp["BH"]), triton.cdiv(P, lp["BP"]))
    _ssd_recurrent_kernel[grid](
        *run.args, P=P, NS=N, BH=lp["BH"], BP=lp["BP"], BN=lp["BN"], HAS_D=D is not None,
        num_warps=lp["num_warps"], num_stages=lp["num_stages"])
    return run.y


def ssd_decode(x, dt, A, B, C, D, state_pool, state_indices):
    """One token for each of n sequences: x [n, H, P]; dt [n, H]; B, C [n, G, N];
    sequence i's state is state_pool[state_indices[i]], advanced in place. Returns y
    [n, H, P]."""
    return ssd_recurrent_varlen(x, dt, A, B, C, D, list(range(x.shape[0] + 1)), state_pool,
                                state_indices)


def ssd_recurrent(x, dt, A, B, C, D=None, initial_state=None):
    """One sequence, as naive.ssd_recurrent. Returns y [T, H, P] in x's dtype and the
    final state [H, P, N] fp32."""
    return one_sequence(ssd_recurrent_varlen, x, dt, A, B, C, D, initial_state)

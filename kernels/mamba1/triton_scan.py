"""Mamba (v1) selective scan in Triton: prefill of packed sequences and batched decode.

The decay exp(dt A[d, n]) differs per channel and state entry, so there is no
chunked matrix form as for Mamba2: a program takes a block of BD channels of one
sequence, keeps their state h [BD, N] in registers and walks the tokens, as
naive.selective_scan does:
    h = exp(dt A) * h + dt x B;   y = h C + D x
Programs over channel blocks and sequences run in parallel; a token's loads are
contiguous rows. States live in a pool [num_cells, D, N] fp32, read and written in
place at each sequence's cell.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptd.kernels.mamba1.naive import check, start_state
from ckptd.kernels.mamba2.chunk import seq_span
from ckptd.kernels.varlen import check_cu, device_cu


@triton.jit
def _scan_kernel(x, dt, A, B, C, Dskip, y, pool, state_idx, cu_seqlens, DIM, stride_x,
                 stride_dt, stride_b, stride_c, stride_pool, NS: tl.constexpr,
                 BD: tl.constexpr, BN: tl.constexpr, HAS_D: tl.constexpr):
    bos, eos, cell = seq_span(cu_seqlens, state_idx, tl.program_id(0))
    cd = tl.program_id(1) * BD + tl.arange(0, BD)
    cn = tl.arange(0, BN)
    md = cd < DIM
    mn = cn < NS
    m2 = md[:, None] & mn[None, :]
    a = tl.load(A + cd[:, None] * NS + cn[None, :], mask=m2, other=0.).to(tl.float32)
    dsk = tl.zeros((BD,), dtype=tl.float32)
    if HAS_D:
        dsk = tl.load(Dskip + cd, mask=md, other=0.).to(tl.float32)
    p_s = pool + cell * stride_pool + cd[:, None] * NS + cn[None, :]
    h = tl.load(p_s, mask=m2, other=0.).to(tl.float32)                # [BD, BN]
    # pointers advance by one token per step (loop counters are int32 in the interpreter)
    p_x = x + bos * stride_x + cd
    p_dt = dt + bos * stride_dt + cd
    p_y = y + bos * DIM + cd
    p_b = B + bos * stride_b + cn
    p_c = C + bos * stride_c + cn
    for _ in range(bos, eos):
        b_x = tl.load(p_x, mask=md, other=0.).to(tl.float32)
        b_dt = tl.load(p_dt, mask=md, other=0.).to(tl.float32)
        b_b = tl.load(p_b, mask=mn, other=0.).to(tl.float32)
        b_c = tl.load(p_c, mask=mn, other=0.).to(tl.float32)
        h = tl.exp(b_dt[:, None] * a) * h + (b_dt * b_x)[:, None] * b_b[None, :]
        b_y = tl.sum(h * b_c[None, :], axis=1) + dsk * b_x
        tl.store(p_y, b_y.to(p_y.dtype.element_ty), mask=md)
        p_x += stride_x
        p_dt += stride_dt
        p_y += DIM
        p_b += stride_b
        p_c += stride_c
    tl.debug_barrier()      # every thread has read the initial state before any writes
    tl.store(p_s, h, mask=m2)


def scan_launch(cc: int | None, D: int, N: int, dtype: torch.dtype) -> dict:
    """Launch parameters of _scan_kernel: cc the compute capability, or None for the CPU
    interpreter (every channel in one program: it pays per operation). On a GPU a block
    of channels whose [BD, N] state is 2K values (BD = 128 at Jamba's N = 16)."""
    BN = max(2, triton.next_power_of_2(N))
    if cc is None:
        return {"BD": triton.next_power_of_2(D), "BN": BN, "num_warps": 4, "num_stages": 1}
    return {"BD": min(triton.next_power_of_2(D), max(16, 2048 // BN)), "BN": BN,
            "num_warps": 4, "num_stages": 1}


def selective_scan_varlen(x, dt, A, B, C, Dskip, cu_seqlens, state_pool, state_indices):
    """Packed sequences, token by token: x [N_tok, D]; dt [N_tok, D] (after softplus);
    A [D, N]; B, C [N_tok, N]; Dskip [D] or None; cu_seqlens int [n + 1] or a Varlen;
    state_pool [S, D, N] fp32 (cells contiguous inside); state_indices int [n].
    Sequence i starts from state_pool[state_indices[i]] and leaves its final state
    there. Returns y [N_tok, D] in x's dtype."""
    n_tok, D, N = check(x, dt, A, B, C, Dskip)
    if state_pool.dim() != 3 or state_pool.shape[1:] != (D, N):
        raise ValueError(f"state_pool must be [cells, {D}, {N}], got {tuple(state_pool.shape)}")
    if state_pool.dtype != torch.float32 or state_pool.stride()[1:] != (N, 1):
        raise ValueError("state_pool must be float32 and contiguous inside a cell")
    cu = check_cu(cu_seqlens, n_tok, state_indices)
    dev = x.device
    x, dt, B, C = (t if t.stride(1) == 1 else t.contiguous() for t in (x, dt, B, C))
    A = A.float().contiguous()
    y = torch.empty(n_tok, D, dtype=x.dtype, device=dev)
    if n_tok == 0:
        return y
    cc = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
    lp = scan_launch(None if cc is None else cc[0] * 10 + cc[1], D, N, x.dtype)
    Dv = Dskip.float().contiguous() if Dskip is not None else A
    grid = (len(cu) - 1, triton.cdiv(D, lp["BD"]))
    _scan_kernel[grid](x, dt, A, B, C, Dv, y, state_pool,
                       torch.as_tensor(state_indices, device=dev).to(torch.int64),
                       device_cu(cu_seqlens, dev), D, x.stride(0), dt.stride(0), B.stride(0),
                       C.stride(0), state_pool.stride(0), NS=N, BD=lp["BD"], BN=lp["BN"],
                       HAS_D=Dskip is not None, num_warps=lp["num_warps"],
                       num_stages=lp["num_stages"])
    return y


def selective_scan(x, dt, A, B, C, Dskip=None, initial_state=None):
    """One sequence, as naive.selective_scan. Returns y [T, D] in x's dtype and the final
    state [D, N] fp32."""
    T, D, N = check(x, dt, A, B, C, Dskip)
    pool = start_state(initial_state, D, N, x.device)[None].contiguous()
    y = selective_scan_varlen(x, dt, A, B, C, Dskip, [0, T], pool, [0])
    return y, pool[0]

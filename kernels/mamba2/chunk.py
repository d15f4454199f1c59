"""Chunked Mamba2 (SSD) prefill in Triton, over packed sequences (varlen).

One program per (sequence, head, block of BP head_dim rows) walks the sequence's
chunks of BT tokens with the state in registers (transposed, S^T [N, BP]); per
chunk, as naive.ssd_chunked (a = cumsum(dt A) inside the chunk):
    y  = ((C B^T) * exp(a_t - a_s) * dt_s, causal) x  +  exp(a_t) C S^T  +  D x
    S  = S exp(a_last) + (x * exp(a_last - a) dt)^T B
Products take the inputs' dtype (16-bit operands run on tensor cores with fp32
accumulation; fp32 inputs multiply in full fp32), the state stays fp32.

States live in a pool [num_cells, H, P, N] fp32; sequence n starts from
pool[state_indices[n]] and leaves its final state there (in place).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ckptd.kernels.mamba2.naive import check, start_state
from ckptd.kernels.varlen import check_cu, device_cu

CHUNK = 64


@triton.jit
def _ssd_chunk_kernel(x, dt, A, B, C, D, y, pool, state_idx, cu_seqlens, H, G, stride_x,
                      stride_b, stride_pool, P: tl.constexpr, NS: tl.constexpr,
                      BT: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
                      HAS_D: tl.constexpr, PREC: tl.constexpr):
    i_h = tl.program_id(1)
    i_p = tl.program_id(2)
    bos, eos, cell = seq_span(cu_seqlens, state_idx, tl.program_id(0))
    i_g = i_h // (H // G)
    rows = tl.arange(0, BT)
    cp = i_p * BP + tl.arange(0, BP)
    cn = tl.arange(0, BN)
    mp = cp < P
    mn = cn < NS
    a_h = tl.load(A + i_h).to(tl.float32)
    d_h = 0.
    if HAS_D:
        d_h = tl.load(D + i_h).to(tl.float32)
    # the state transposed, S^T [BN, BP]: both of its products then take it as it is
    p_s = pool + cell * stride_pool + i_h * P * NS + cn[:, None] + cp[None, :] * NS
    m_s = mn[:, None] & mp[None, :]
    b_s = tl.load(p_s, mask=m_s, other=0.).to(tl.float32)               # [BN, BP]
    causal = rows[:, None] >= rows[None, :]
    # pointers advance by one chunk per step (loop counters are int32 in the interpreter)
    p_x = x + (bos + rows)[:, None] * stride_x + i_h * P + cp[None, :]
    p_y = y + (bos + rows)[:, None] * (H * P) + i_h * P + cp[None, :]
    p_bt = B + (bos + rows)[None, :] * stride_b + i_g * NS + cn[:, None]  # B^T [BN, BT]
    p_c = C + (bos + rows)[:, None] * stride_b + i_g * NS + cn[None, :]
    p_dt = dt + (bos + rows) * H + i_h
    for c0 in range(bos, eos, BT):
        left = eos - c0                                   # valid rows of this chunk
        m = rows < left
        mx = m[:, None] & mp[None, :]
        b_x = tl.load(p_x, mask=mx, other=0.)
        b_bt = tl.load(p_bt, mask=mn[:, None] & m[None, :], other=0.)
        b_c = tl.load(p_c, mask=m[:, None] & mn[None, :], other=0.)
        b_dt = tl.load(p_dt, mask=m, other=0.).to(tl.float32)
        b_a = tl.cumsum(b_dt * a_h, axis=0)
        b_al = tl.sum(tl.where(rows == tl.minimum(left, BT) - 1, b_a, 0.), axis=0)
        seg = tl.where(causal, b_a[:, None] - b_a[None, :], float("-inf"))
        b_w = tl.dot(b_c, b_bt, input_precision=PREC) * tl.exp(seg) * b_dt[None, :]
        b_y = tl.dot(b_w.to(b_x.dtype), b_x, input_precision=PREC)
        b_y += tl.exp(b_a)[:, None] * tl.dot(b_c, b_s.to(b_c.dtype), input_precision=PREC)
        if HAS_D:
            b_y += d_h * b_x.to(tl.float32)
        tl.store(p_y, b_y.to(p_y.dtype.element_ty), mask=mx)
        b_xw = b_x.to(tl.float32) * (tl.exp(b_al - b_a) * b_dt)[:, None]
        b_s = b_s * tl.exp(b_al) + tl.dot(b_bt, b_xw.to(b_bt.dtype), input_precision=PREC)
        p_x += BT * stride_x
        p_y += BT * H * P
        p_bt += BT * stride_b
        p_c += BT * stride_b
        p_dt += BT * H
    tl.debug_barrier()      # every thread has read the initial state before any writes
    tl.store(p_s, b_s, mask=m_s)


def chunk_launch(cc: int | None, P: int, N: int, dtype: torch.dtype) -> dict:
    """Launch parameters of _ssd_chunk_kernel (constexprs, num_warps, num_stages) for
    head_dim P, state size N and the inputs' dtype: cc the compute capability (80, 86,
    89, 90, ...), or None for the CPU interpreter, which pays per operation, not per
    element (one block of all P rows there).

    On a GPU a block of BP rows keeps its [N, BP] fp32 state in registers. 16-bit
    inputs: chunks of 64 and BP * BN = 8K state values. fp32 inputs multiply in full
    fp32 without tensor cores (ptxas then takes ~10x longer to build the unrolled
    products) and stage twice the bytes: chunks of 16, BP = 16, loads not pipelined.
    Shared memory grows with N, the most at Falcon-H1's N = 256 (86.5 KB bf16 on
    sm_90), within every target's limit; tests/kernels/test_mamba_compile.py builds
    the cubins to hold this."""
    BN = max(16, triton.next_power_of_2(N))
    BP = max(16, triton.next_power_of_2(P))
    if cc is None:
        return {"BT": CHUNK, "BP": BP, "BN": BN, "num_warps": 4, "num_stages": 1}
    if dtype == torch.float32:
        return {"BT": 16, "BP": min(BP, max(16, 2048 // BN)), "BN": BN, "num_warps": 4,
                "num_stages": 1}
    BP = min(BP, max(16, 8192 // BN))
    return {"BT": CHUNK, "BP": BP, "BN": BN, "num_warps": 8 if BP * BN >= 4096 else 4,
            "num_stages": 2}


def precision(dtype: torch.dtype) -> str:
    """fp32 inputs multiply in full fp32; 16-bit operands ignore it."""
    return "ieee" if dtype == torch.float32 else "tf32"


def check_varlen(x, dt, A, B, C, D, cu_seqlens, state_pool, state_indices) -> list[int]:
    """Validate the packed layout shared by the chunked and recurrent kernels; returns
    cu_seqlens as a host list."""
    n_tok, H, P, G, N = check(x, dt, A, B, C, D)
    if state_pool.dim() != 4 or state_pool.shape[1:] != (H, P, N):
        raise ValueError(f"state_pool must be [cells, {H}, {P}, {N}], "
                         f"got {tuple(state_pool.shape)}")
    if state_pool.dtype != torch.float32:
        raise ValueError(f"state_pool must be float32, got {state_pool.dtype}")
    if state_pool.stride()[1:] != (P * N, N, 1):
        raise ValueError("state_pool must be contiguous inside a cell")
    if B.dtype != x.dtype or C.dtype != x.dtype:
        raise ValueError(f"x, B and C must share a dtype, got {x.dtype}, {B.dtype}, {C.dtype}")
    cu = check_cu(cu_seqlens, n_tok, state_indices)
    devices = {t.device for t in (x, dt, A, B, C, state_pool)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")
    return cu


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    """x [T, a, b] whose rows may be strided (a split of the conv output) but whose
    [a, b] inside a row is contiguous: the kernels take a row stride."""
    return x if x.stride()[1:] == (x.shape[2], 1) else x.contiguous()


@dataclass
class Launch:
    """A varlen call checked and laid out for either kernel of this folder: `args` are
    the arguments both kernels take first, `cc` the device's compute capability (None
    off CUDA), `y` the output."""
    cu: list[int]
    args: tuple
    y: torch.Tensor
    cc: int | None

    @classmethod
    def of(cls, x, dt, A, B, C, D, cu_seqlens, state_pool, state_indices) -> Launch:
        cu = check_varlen(x, dt, A, B, C, D, cu_seqlens, state_pool, state_indices)
        n_tok, H, P = x.shape
        dev = x.device
        x, B, C = _rows_contiguous(x), _rows_contiguous(B), _rows_contiguous(C)
        dt, A = dt.float().contiguous(), A.float().contiguous()
        y = torch.empty(n_tok, H, P, dtype=x.dtype, device=dev)
        Dv = D.float().contiguous() if D is not None else A
        cells = torch.as_tensor(state_indices, device=dev).to(torch.int64)
        cc = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
        args = (x, dt, A, B, C, Dv, y, state_pool, cells, device_cu(cu_seqlens, dev), H,
                B.shape[1], x.stride(0), B.stride(0), state_pool.stride(0))
        return cls(cu, args, y, None if cc is None else cc[0] * 10 + cc[1])


@triton.jit
def seq_span(cu_seqlens, state_idx, i_n):
    """(first token, one past the last, state cell) of packed sequence i_n."""
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    cell = tl.load(state_idx + i_n).to(tl.int64)
    return bos, eos, cell


def ssd_chunk_varlen(x, dt, A, B, C, D, cu_seqlens, state_pool, state_indices,
                     chunk_size=None):
    """Chunked prefill of several packed sequences.

    x [N, H, P]; dt [N, H] (after softplus); A [H] (< 0); B, C [N, G, N_s]; D [H] or
    None; cu_seqlens int [n + 1] or a Varlen; state_pool [S, H, P, N_s] fp32 (cells
    contiguous inside); state_indices int [n]. Sequence i starts from
    state_pool[state_indices[i]] and leaves its final state there. Returns y [N, H, P]
    in x's dtype. chunk_size: the tokens of a chunk (16, 32, 64 or 128), by default
    chunk_launch's for the device and dtype.
    """
    if chunk_size is not None and chunk_size not in (16, 32, 64, 128):
        raise ValueError(f"chunk_size must be 16, 32, 64 or 128, got {chunk_size}")
    run = Launch.of(x, dt, A, B, C, D, cu_seqlens, state_pool, state_indices)
    H, P, N = x.shape[1], x.shape[2], B.shape[2]
    if x.shape[0] == 0:
        return run.y
    lp = chunk_launch(run.cc, P, N, x.dtype)
    if chunk_size is not None:
        lp["BT"] = chunk_size
    _ssd_chunk_kernel[(len(run.cu) - 1, H, triton.cdiv(P, lp["BP"]))](
        *run.args, P=P, NS=N, BT=lp["BT"], BP=lp["BP"], BN=lp["BN"], HAS_D=D is not None,
        PREC=precision(x.dtype), num_warps=lp["num_warps"], num_stages=lp["num_stages"])
    return run.y


def one_sequence(varlen_fn, x, dt, A, B, C, D, initial_state, **kw):
    """A varlen kernel on one sequence: (y [T, H, P], final state [H, P, N] fp32) from
    initial_state [H, P, N] or zeros."""
    T, H, P, G, N = check(x, dt, A, B, C, D)
    pool = start_state(initial_state, H, P, N, x.device)[None].contiguous()
    y = varlen_fn(x, dt, A, B, C, D, [0, T], pool, [0], **kw)
    return y, pool[0]


def ssd_chunked(x, dt, A, B, C, D=None, initial_state=None, chunk_size=None):
    """One sequence, as naive.ssd_chunked: x [T, H, P]; dt [T, H]; A [H]; B, C
    [T, G, N]; D [H] or None; initial_state [H, P, N] or None (zeros). Returns y
    [T, H, P] in x's dtype and the final state [H, P, N] fp32."""
    return one_sequence(ssd_chunk_varlen, x, dt, A, B, C, D, initial_state,
                        chunk_size=chunk_size)

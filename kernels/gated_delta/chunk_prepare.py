"""Stage 1 of the chunked gated delta rule (chunk.py): everything inside one chunk.

One program per (chunk, head), all chunks in parallel, in the step's dot dtype DT (the
dtype of w: v's), with fp32 accumulation:
    gc = cumsum(g) inside the chunk                              -> gc [N, H] fp32
    A  = strictly-lower(beta_i k_i.k_j exp(gc_i - gc_j))          K in slabs of BK
    X  = (I + A)^-1                                               fp32
    w  = X (k beta exp(gc)),  u = X (v beta)                      -> w [N, H, K], u [N, H, V] DT
The inverse: forward substitution inside 16-row diagonal blocks gives D = (I + A_d)^-1;
with N = D A_o (A_o the part below the diagonal blocks, nilpotent),
(I + A)^-1 = (I - N + N^2 - ...) D.
"""

from __future__ import annotations

import triton
import triton.language as tl

SUB = 16  # rows of one diagonal block solved by forward substitution


@triton.jit
def _inverse(b_A, rows, BT: tl.constexpr, SUB: tl.constexpr):
    """(I + A)^-1 of a strictly lower [BT, BT] fp32 matrix."""
    same = (rows // SUB)[:, None] == (rows // SUB)[None, :]
    b_Ad = tl.where(same, b_A, 0.)
    b_Ao = tl.where(same, 0., b_A)
    eye = tl.where(rows[:, None] == rows[None, :], 1., 0.)
    # D = (I + A_d)^-1, row i of every diagonal block at once
    b_D = eye
    for i in range(1, SUB):
        sel = ((rows % SUB) == i)[:, None]
        b_D = tl.where(sel, eye - tl.dot(tl.where(sel, b_Ad, 0.), b_D, input_precision="ieee"),
                       b_D)
    b_N = tl.dot(b_D, b_Ao, input_precision="ieee")
    b_P = eye
    for _ in tl.static_range(BT // SUB - 1):
        b_P = eye - tl.dot(b_N, b_P, input_precision="ieee")   # Horner: I - N + N^2 - ...
    return tl.dot(b_P, b_D, input_precision="ieee")


@triton.jit
def _prepare_kernel(k, v, g, beta, w, u, gc, chunk_bos, chunk_eos, H,
                    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                    BV: tl.constexpr, SUB: tl.constexpr, PREC: tl.constexpr):
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    DT = w.dtype.element_ty
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    eos = tl.load(chunk_eos + i_c).to(tl.int64)
    rows = tl.arange(0, BT)
    t = bos + rows
    m = t < eos
    b_g = tl.load(g + t * H + i_h, mask=m, other=0.).to(tl.float32)
    b_beta = tl.load(beta + t * H + i_h, mask=m, other=0.).to(tl.float32)
    b_gc = tl.cumsum(b_g, axis=0)
    tl.store(gc + t * H + i_h, b_gc, mask=m)

    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for k0 in tl.static_range(0, K, BK):
        ck = k0 + tl.arange(0, BK)
        b_k = tl.load(k + (t[:, None] * H + i_h) * K + ck[None, :],
                      mask=m[:, None] & (ck < K)[None, :], other=0.).to(DT)
        b_A += tl.dot(b_k, tl.trans(b_k), input_precision=PREC)
    lower = rows[:, None] > rows[None, :]
    b_A = tl.where(lower, b_A * b_beta[:, None] * tl.exp(b_gc[:, None] - b_gc[None, :]), 0.)
    b_X = _inverse(b_A, rows, BT, SUB).to(DT)

    b_kw = b_beta * tl.exp(b_gc)
    for k0 in tl.static_range(0, K, BK):
        ck = k0 + tl.arange(0, BK)
        mk = m[:, None] & (ck < K)[None, :]
        p_k = (t[:, None] * H + i_h) * K + ck[None, :]
        b_k = tl.load(k + p_k, mask=mk, other=0.).to(tl.float32)
        b_w = tl.dot(b_X, (b_k * b_kw[:, None]).to(DT), input_precision=PREC)
        tl.store(w + p_k, b_w.to(DT), mask=mk)
    for v0 in tl.static_range(0, V, BV):
        cv = v0 + tl.arange(0, BV)
        mv = m[:, None] & (cv < V)[None, :]
        p_v = (t[:, None] * H + i_h) * V + cv[None, :]
        b_v = tl.load(v + p_v, mask=mv, other=0.).to(tl.float32)
        b_u = tl.dot(b_X, (b_v * b_beta[:, None]).to(DT), input_precision=PREC)
        tl.store(u + p_v, b_u.to(DT), mask=mv)


def prepare(k, v, g, beta, w, u, gc, chunk_bos, chunk_eos, launch) -> None:
    """w, u, gc of every chunk (chunk_bos / chunk_eos int32 [chunks]) in place."""
    _, H, K = k.shape
    V = v.shape[2]
    _prepare_kernel[(chunk_bos.numel(), H)](k, v, g, beta, w, u, gc, chunk_bos, chunk_eos, H,
                                            K=K, V=V, SUB=SUB,
                                            **launch.kwargs())


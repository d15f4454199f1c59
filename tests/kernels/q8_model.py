"""A numpy model of cpu.c's integer dot (--gemv-activations q8): the same int8
activations, the same exact integer lanes, the same fp32 operations in the same order,
so the C kernel (AVX2, VNNI or scalar) must equal it bit for bit."""

from __future__ import annotations

import numpy as np

F32 = np.float32


def quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [M, K] fp32 -> (q int8 [M, K], ds fp32 [M, K / 32, 2]: d and d * sum q)."""
    M, K = x.shape
    b = x.astype(F32).reshape(M, K // 32, 32)
    d = np.abs(b).max(axis=-1) / F32(127)
    inv = np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0)).astype(F32)
    q = np.clip(np.rint(b * inv[..., None]), -127, 127).astype(np.int8)
    s = d * q.astype(np.int32).sum(-1).astype(F32)
    return q.reshape(M, K), np.stack([d, s], axis=-1).astype(F32)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(F32)


def weight_blocks(fmt: str, data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 [N, row bytes] -> (integer values [N, nb, 32], d [N, nb], m [N, nb] or 0)."""
    N = data.shape[0]
    bb = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[fmt]
    blk = data.reshape(N, -1, bb)
    d = _f16(blk[..., 0:2])
    if fmt == "Q8_0":
        return blk[..., 2:].view(np.int8).astype(np.int32), d, np.zeros_like(d)
    qs = blk[..., 4:] if fmt == "Q4_1" else blk[..., 2:]
    v = np.concatenate([qs & 0xF, qs >> 4], axis=-1).astype(np.int32)
    if fmt == "Q4_0":
        return v - 8, d, np.zeros_like(d)
    return v, d, _f16(blk[..., 2:4])


def gemv(fmt: str, data: np.ndarray, q: np.ndarray, ds: np.ndarray) -> np.ndarray:
    """y [M, N] = W x for quantize's (q, ds), as cpu.c's ckq_gemv_q8 computes it."""
    wv, wd, wm = weight_blocks(fmt, data)
    N, nb, _ = wv.shape
    M = q.shape[0]
    y = np.empty((M, N), F32)
    for m in range(M):
        xq = q[m].reshape(nb, 32).astype(np.int32)
        lanes = (wv * xq).reshape(N, nb, 8, 4).sum(-1).astype(F32)    # exact integers
        acc = np.zeros((N, 8), F32)
        macc = np.zeros(N, F32)
        for b in range(nb):
            dd = wd[:, b] * ds[m, b, 0]
            acc = acc + dd[:, None] * lanes[:, b]
            if fmt == "Q4_1":
                macc = macc + wm[:, b] * ds[m, b, 1]
        a = acc.T
        y[m] = (((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))) + macc
    return y

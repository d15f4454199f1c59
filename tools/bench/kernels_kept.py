"""The kernel benchmark's kept-weight rows (tools/bench/kernels.py): GGUF weights kept in
their blocks, dequantized inside the matmul, beside torch's dense matmul of the same shape.

    kept_gemv_<fmt>, kept_gemv_m8_<fmt>   "triton": the decode GEMV (kernels/quant/gemv.py),
                                          1 and 8 rows, every block format; beside Q4_K's,
                                          "triton tiled" (kernels/quant/triton_quant.py,
                                          the kernel before) and torch's dense GEMV
    kept_gemm_m<M>_<fmt>                  the tiled GEMM at prefill rows (dense beside Q4_K)
    kept_moe_t<T>                         a decode step's T tokens through the 35B-A3B's
                                          kept experts (256 of 2048 x 512, top 8; gate and up
                                          Q4_K, down Q6_K as in Q4_K_M): "triton", the
                                          per-pair GEMV, beside "triton grouped" (the grouped
                                          GEMM) and torch's dense bmm over the same experts

Bytes are what the op must read: the weight blocks (for the experts, those of the experts
the tokens chose, each once) and the activations; the rows compare with --peak-gbps.
"""

from __future__ import annotations

from collections.abc import Iterator

FORMATS = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def _blocks(fmt: str, n: int, rng, std: float):
    """n valid blocks of fmt: big_gguf's random blocks where it makes them, else random
    bytes under a small fp16 scale (and min)."""
    # on use: kernels.py sets TRITON_INTERPRET before triton loads
    import numpy as np

    from ckptd.kernels.quant.formats import FORMATS as TYPES
    from ckptd.tools.bench.big_gguf import random_blocks

    if fmt in ("Q4_K", "Q6_K", "Q8_0"):
        return random_blocks(fmt, n, rng, std)
    ts = TYPES[fmt][2]
    b = np.frombuffer(rng.bytes(n * ts), dtype=np.uint8).reshape(n, ts).copy()
    scale = np.full((n, 1), std / 16, np.float16).view(np.uint8)
    b[:, 0:2] = scale
    if fmt != "Q4_0":                       # Q4_1's min, Q5_K's dmin
        b[:, 2:4] = scale
    return b


def kept_tensor(fmt: str, shape: tuple[int, ...], dev, rng):
    # on use: kernels.py sets TRITON_INTERPRET before triton loads
    import torch

    from ckptd.kernels.quant.formats import FORMATS as TYPES
    from ckptd.kernels.quant.formats import QuantTensor

    _, bs, ts = TYPES[fmt]
    n = 1
    for d in shape:
        n *= d
    blocks = _blocks(fmt, n // bs, rng, shape[-1] ** -0.5)
    data = torch.from_numpy(blocks).view(*shape[:-1], shape[-1] // bs * ts).to(dev)
    return QuantTensor(data, fmt, shape)


def kept_cases(s, dev, dt, case) -> Iterator:
    """s: kernels.py's Sizes; case: its Case(op, impl, fn, flops, nbytes)."""
    # on use: kernels.py sets TRITON_INTERPRET before triton loads
    import numpy as np
    import torch

    from ckptd.kernels.quant import gemv, triton_quant

    n = k = s.gemv
    dense = torch.randn(n, k, device=dev, dtype=dt) / k ** 0.5
    rng = np.random.default_rng(0)
    name = f"torch dense {str(dt).split('.')[-1]}"
    for m in s.gemv_rows:
        x = torch.randn(m, k, device=dev, dtype=dt)
        op = "kept_gemv" if m == 1 else f"kept_gemv_m{m}"
        act = 2 * m * (n + k) * x.element_size()
        for fmt in FORMATS:
            qt = kept_tensor(fmt, (n, k), dev, rng)
            yield case(f"{op}_{fmt}", "triton", lambda x=x, qt=qt: gemv.matmul(x, qt),
                       2 * m * n * k, qt.nbytes + act)
            if fmt == "Q4_K":           # the row before (the tiled GEMM), and dense
                yield case(f"{op}_{fmt}", "triton tiled", lambda x=x, qt=qt:
                           triton_quant.matmul(x, qt), 2 * m * n * k, qt.nbytes + act)
                yield case(f"{op}_{fmt}", name, lambda x=x: x @ dense.T, 2 * m * n * k,
                           (n * k + m * (n + k)) * x.element_size())
    x = torch.randn(s.gemm_m, k, device=dev, dtype=dt)
    for fmt in ("Q4_K", "Q6_K", "Q8_0"):
        qt = kept_tensor(fmt, (n, k), dev, rng)
        yield case(f"kept_gemm_m{s.gemm_m}_{fmt}", "triton",
                   lambda qt=qt: triton_quant.matmul(x, qt), 2 * s.gemm_m * n * k,
                   qt.nbytes + 2 * s.gemm_m * (n + k) * x.element_size())
    yield case(f"kept_gemm_m{s.gemm_m}_Q4_K", name, lambda: x @ dense.T, 2 * s.gemm_m * n * k,
               (n * k + s.gemm_m * (n + k)) * x.element_size())
    yield from _moe_cases(s, dev, dt, case, rng)


def _moe_cases(s, dev, dt, case, rng) -> Iterator:
    # on use: kernels.py sets TRITON_INTERPRET before triton loads
    import torch

    from ckptd.kernels.quant import gemv, triton_quant

    E, inter, H, top = s.experts, s.expert_inter, s.moe_hidden, s.topk
    gate = kept_tensor("Q4_K", (E, inter, H), dev, rng)
    up = kept_tensor("Q4_K", (E, inter, H), dev, rng)
    down = kept_tensor("Q6_K", (E, H, inter), dev, rng)
    per_expert = (gate.nbytes + up.nbytes + down.nbytes) // E
    g = torch.Generator().manual_seed(0)
    for T in s.moe_tokens:
        x = torch.randn(T, H, generator=g).to(dev, dt)
        ids = torch.rand(T, E, generator=g).topk(top, dim=-1).indices.to(dev)
        w = torch.softmax(torch.randn(T, top, generator=g), -1).to(dev)
        chosen = ids.reshape(-1)
        flops = 2 * T * top * 3 * inter * H
        nbytes = int(chosen.unique().numel()) * per_expert + 2 * T * H * x.element_size()
        yield case(f"kept_moe_t{T}", "triton",
                   lambda x=x, ids=ids, w=w: gemv.moe_experts(x, ids, w, gate, up, down),
                   flops, nbytes)
        yield case(f"kept_moe_t{T}", "triton grouped",
                   lambda x=x, ids=ids, w=w: triton_quant.moe_experts(x, ids, w, gate, up, down),
                   flops, nbytes)
        # the same experts dense, gathered beforehand: one bmm per projection per pair
        wg = torch.randn(T * top, inter, H, device=dev, dtype=dt) / H ** 0.5
        wu, wd = torch.randn_like(wg), torch.randn(T * top, H, inter, device=dev, dtype=dt)
        xs = x.repeat_interleave(top, dim=0).unsqueeze(-1)

        def dense(xs=xs, wg=wg, wu=wu, wd=wd, w=w, T=T):
            h = torch.nn.functional.silu(torch.bmm(wg, xs)) * torch.bmm(wu, xs)
            return (torch.bmm(wd, h).squeeze(-1) * w.reshape(-1, 1)).view(T, top, H).sum(1)
        dense_bytes = T * top * 3 * inter * H * x.element_size()    # its gathered copies
        yield case(f"kept_moe_t{T}", f"torch dense bmm {str(dt).split('.')[-1]}", dense,
                   flops, dense_bytes + 2 * T * H * x.element_size())

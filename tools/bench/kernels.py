"""Kernel benchmark: each Triton op's time, achieved TFLOP/s or GB/s against a peak,
beside the same op from the plain-torch reference, transformers and fla
(flash-linear-attention) where they are installed.

    python tools/bench/kernels.py --peak-tflops 989 --peak-gbps 3350 --out report.json
    python tools/bench/kernels.py --smoke      # tiny shapes, CPU, Triton interpreter

Shapes are those of a Qwen3.5-9B-like layer (32 value heads of 128, conv over 8192
channels, 16 query / 4 KV heads of 256) in bf16, or with --shapes a3b the 35B-A3B's
(2 KV heads, hidden 2048, 32K tokens of cached context). FLOP and byte counts are the work
the op has to do, the same for every implementation, so rates compare directly.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class Sizes:
    T: int = 8192          # prefill tokens
    N: int = 64            # decoding sequences
    H: int = 32            # gated delta value heads
    K: int = 128
    V: int = 128
    C: int = 8192          # conv channels
    KW: int = 4
    Hq: int = 16
    Hkv: int = 4
    D: int = 256
    B: int = 16            # tokens per page
    ctx: int = 8192        # cached tokens before a prefill chunk / per decoding sequence
    hidden: int = 4096
    gemv: int = 4096       # the kept-weight matmul: N = K (issue 34's probe: 4096 x 4096)
    gemm_m: int = 512      # its rows at prefill sizes
    # the kept experts of a decode step (kernels_kept.py): the 35B-A3B's in both shape sets
    experts: int = 256
    expert_inter: int = 512
    moe_hidden: int = 2048
    topk: int = 8
    moe_tokens: tuple[int, ...] = (1, 8)
    gemv_rows: tuple[int, ...] = (1, 8)     # the kept GEMV's rows (a decode step's tokens)


# Qwen3.5/3.6-35B-A3B's layer: the same Gated DeltaNet and conv widths, 2 KV heads, hidden
# 2048; cached context 32K (issue 34's table: paged prefill and decode at 32K)
A3B = Sizes(Hkv=2, hidden=2048, ctx=32768)
SHAPES = {"9b": Sizes(), "a3b": A3B}

SMOKE = Sizes(T=70, N=3, H=2, K=24, V=40, C=40, KW=4, Hq=4, Hkv=2, D=24, B=16, ctx=50,
              hidden=64, gemv=256, gemm_m=8, experts=4, expert_inter=256, moe_hidden=256,
              topk=1, moe_tokens=(1,), gemv_rows=(1,))


@dataclass(frozen=True)
class Case:
    op: str
    impl: str
    fn: Callable[[], object]
    flops: float
    nbytes: float


def _timeit(fn: Callable[[], object], cuda: bool, iters: int) -> float:
    """Median seconds per call."""
    import torch  # here and below: run() sets TRITON_INTERPRET before triton loads

    if cuda:
        fn()                                               # compile, warm caches
    times = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _optional(module: str, name: str):
    try:
        return getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError):
        return None


def _gdn_cases(s: Sizes, dev, dt) -> Iterator[Case]:
    import torch  # (imported here: see _timeit)

    from ckptd.kernels.gated_delta import chunk, fused_recurrent, naive

    T, H, K, V = s.T, s.H, s.K, s.V
    q = naive.l2norm(torch.randn(T, H, K, device=dev)).to(dt)
    k = naive.l2norm(torch.randn(T, H, K, device=dev)).to(dt)
    v = torch.randn(T, H, V, device=dev, dtype=dt)
    g = -torch.rand(T, H, device=dev)
    beta = torch.rand(T, H, device=dev)
    s0 = torch.zeros(H, K, V, device=dev)
    BT = 64
    flops = T * H * (2 * BT * (3 * K + 2 * V) + 6 * K * V)     # chunked form, per token
    nbytes = T * H * (2 * K + 2 * V) * q.element_size() + 2 * H * K * V * 4
    yield Case("gdn_chunk_prefill", "triton",
               lambda: chunk.chunk_gated_delta_rule(q, k, v, g, beta, s0), flops, nbytes)
    yield Case("gdn_chunk_prefill", "torch",
               lambda: naive.chunk_gated_delta_rule(q, k, v, g, beta, s0), flops, nbytes)
    hf = _optional("transformers.models.qwen3_5.modeling_qwen3_5", "torch_chunk_gated_delta_rule")
    if hf is not None:
        yield Case("gdn_chunk_prefill", "transformers",
                   lambda: hf(q[None], k[None], v[None], g[None], beta[None],
                              initial_state=s0[None], output_final_state=True), flops, nbytes)
    fla = _optional("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")
    if fla is not None and dev.type == "cuda":
        yield Case("gdn_chunk_prefill", "fla",
                   lambda: fla(q=q[None], k=k[None], v=v[None], g=g[None], beta=beta[None],
                               initial_state=s0[None], output_final_state=True), flops, nbytes)

    N = s.N
    pool = torch.zeros(N, H, K, V, device=dev)
    qd, kd, vd, gd, bd = q[:N], k[:N], v[:N], g[:N], beta[:N]
    cells = torch.arange(N, device=dev)
    flops = N * H * 6 * K * V
    nbytes = N * H * K * V * 4 * 2                               # state read + write
    yield Case("gdn_decode", "triton",
               lambda: fused_recurrent.gated_delta_decode(qd, kd, vd, gd, bd, pool, cells),
               flops, nbytes)
    yield Case("gdn_decode", "torch",
               lambda: naive.recurrent_gated_delta_rule(
                   qd.reshape(1, N * H, K), kd.reshape(1, N * H, K), vd.reshape(1, N * H, V),
                   gd.reshape(1, -1), bd.reshape(1, -1), pool.view(N * H, K, V)), flops, nbytes)
    fla_rec = _optional("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule")
    if fla_rec is not None and dev.type == "cuda":
        yield Case("gdn_decode", "fla",
                   lambda: fla_rec(q=qd[:, None], k=kd[:, None], v=vd[:, None], g=gd[:, None],
                                   beta=bd[:, None], initial_state=pool,
                                   output_final_state=True), flops, nbytes)


def _conv_cases(s: Sizes, dev, dt) -> Iterator[Case]:
    import torch  # (imported here: see _timeit)

    from ckptd.kernels.conv1d import naive, triton_conv

    x = torch.randn(s.T, s.C, device=dev, dtype=dt)
    w = torch.randn(s.C, s.KW, device=dev, dtype=dt)
    s0 = torch.randn(s.C, s.KW - 1, device=dev, dtype=dt)
    nbytes = 2 * x.numel() * x.element_size()
    flops = 2 * x.numel() * s.KW
    yield Case("conv_prefill", "triton", lambda: triton_conv.causal_conv1d(x, w, None, s0),
               flops, nbytes)
    yield Case("conv_prefill", "torch", lambda: naive.causal_conv1d(x, w, None, s0), flops, nbytes)
    xd = x[:s.N]
    pool = torch.randn(s.N, s.C, s.KW - 1, device=dev, dtype=dt)
    cells = torch.arange(s.N, device=dev)
    nbytes = (2 * xd.numel() + 2 * pool.numel()) * x.element_size()
    yield Case("conv_decode", "triton",
               lambda: triton_conv.causal_conv1d_update_cells(xd, pool, cells, w), 0, nbytes)
    yield Case("conv_decode", "torch", lambda: naive.causal_conv1d_update(xd, pool, w), 0, nbytes)


def _attention_cases(s: Sizes, dev, dt) -> Iterator[Case]:
    import torch  # (imported here: see _timeit)
    import torch.nn.functional as F

    from ckptd.kernels.paged_attention import naive, triton_attention, triton_pages

    L = s.ctx + s.T
    n_pages = -(-L // s.B)
    pool = torch.randn(n_pages + 1, 1, 2, s.B, s.Hkv, s.D, device=dev, dtype=dt)
    table = torch.randperm(n_pages + 1, device=dev)[:n_pages].to(torch.int32)
    q = torch.randn(s.T, s.Hq, s.D, device=dev, dtype=dt)
    scale = s.D ** -0.5
    flops = 4 * s.T * (s.ctx + s.T / 2) * s.Hq * s.D                  # causal QK^T and PV
    nbytes = (2 * q.numel() + 2 * L * s.Hkv * s.D) * q.element_size()
    yield Case("paged_prefill", "triton",
               lambda: triton_attention.paged_attention(q, pool, 0, table, s.ctx, scale),
               flops, nbytes)
    kv = pool[table.long(), 0].transpose(0, 1).reshape(2, -1, s.Hkv, s.D)[:, :L]
    rep = s.Hq // s.Hkv
    kc = kv[0].repeat_interleave(rep, 1).transpose(0, 1)[None]
    vc = kv[1].repeat_interleave(rep, 1).transpose(0, 1)[None]
    mask = (torch.arange(L, device=dev)[None] <= torch.arange(s.T, device=dev)[:, None] + s.ctx)
    yield Case("paged_prefill", "torch-sdpa(contiguous)",
               lambda: F.scaled_dot_product_attention(q.transpose(0, 1)[None], kc, vc,
                                                      attn_mask=mask), flops, nbytes)
    N = s.N
    pages_per = -(-s.ctx // s.B)
    dpool = torch.randn(N * pages_per, 1, 2, s.B, s.Hkv, s.D, device=dev, dtype=dt)
    tables = torch.randperm(N * pages_per, device=dev).to(torch.int32).view(N, pages_per)
    lens = torch.full((N,), s.ctx, dtype=torch.int32, device=dev)
    qd = q[:N]
    flops = 4 * N * s.ctx * s.Hq * s.D
    nbytes = 2 * N * s.ctx * s.Hkv * s.D * q.element_size()
    yield Case("paged_decode", "triton",
               lambda: triton_attention.paged_decode_attention(qd, dpool, 0, tables, lens, scale),
               flops, nbytes)
    yield Case("paged_decode", "torch",
               lambda: naive.paged_decode_attention(qd, dpool, 0, tables, lens, scale),
               flops, nbytes)
    kn = torch.randn(s.T, s.Hkv, s.D, device=dev, dtype=dt)
    kv_index = (table.long()[torch.arange(s.T, device=dev) // s.B] * s.B
                + torch.arange(s.T, device=dev) % s.B)
    nbytes = 4 * kn.numel() * kn.element_size()
    yield Case("write_kv", "triton", lambda: triton_pages.write_kv(pool, 0, kv_index, kn, kn), 0,
               nbytes)
    yield Case("write_kv", "torch", lambda: naive.write_kv(pool, 0, kv_index, kn, kn), 0, nbytes)
    ids = table[: max(1, n_pages // 2)]
    nbytes = 2 * len(ids) * pool[0].numel() * pool.element_size()
    yield Case("gather_pages", "triton", lambda: triton_pages.gather_rows(pool, ids), 0, nbytes)
    yield Case("gather_pages", "torch", lambda: naive.gather_pages(pool, ids), 0, nbytes)


def _pointwise_cases(s: Sizes, dev, dt) -> Iterator[Case]:
    import torch  # (imported here: see _timeit)

    from ckptd.kernels.norm import naive as norm_ref
    from ckptd.kernels.norm import triton_norm
    from ckptd.kernels.rotary import naive as rot_ref
    from ckptd.kernels.rotary import triton_rotary
    from ckptd.kernels.swiglu import naive as swiglu_ref
    from ckptd.kernels.swiglu import triton_swiglu

    x = torch.randn(s.T, s.hidden, device=dev, dtype=dt)
    z = torch.randn(s.T, s.hidden, device=dev, dtype=dt)
    w = torch.randn(s.hidden, device=dev, dtype=dt)
    n = x.numel() * x.element_size()
    for impl, mod in (("triton", triton_norm), ("torch", norm_ref)):
        yield Case("rms_norm", impl, lambda m=mod: m.rms_norm(x, w, 1e-6, 1.0), 0, 2 * n)
        yield Case("gated_rms_norm", impl, lambda m=mod: m.gated_rms_norm(x, z, w, 1e-6), 0, 3 * n)
    for impl, mod in (("triton", triton_swiglu), ("torch", swiglu_ref)):
        yield Case("silu_and_mul", impl, lambda m=mod: m.silu_and_mul(x, z), 0, 3 * n)
    qh = x.view(s.T, -1, s.D) if s.hidden % s.D == 0 else x[:, None]
    cos, sin = rot_ref.rotary_cos_sin(torch.arange(s.T, device=dev), qh.shape[-1] // 4, 1e7)
    for impl, mod in (("triton", triton_rotary), ("torch", rot_ref)):
        yield Case("rotary_partial", impl, lambda m=mod: m.apply_rotary(qh, cos, sin), 0, 2 * n)


def _kept_cases(s: Sizes, dev, dt) -> Iterator[Case]:
    # on use, as the other cases' imports (see _timeit)
    from ckptd.tools.bench.kernels_kept import kept_cases

    return kept_cases(s, dev, dt, Case)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes on the CPU through the Triton interpreter, one run each")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="9b",
                        help="a Qwen3.5-9B-like layer (default) or the 35B-A3B's")
    parser.add_argument("--peak-tflops", type=float, default=0.0,
                        help="the device's dense peak for the dtype (H100 SXM bf16: 989)")
    parser.add_argument("--peak-gbps", type=float, default=0.0,
                        help="the device's memory bandwidth (H100 SXM: 3350)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--ctx", type=int, help="cached tokens per decoding sequence and "
                        "before a prefill chunk (default 8192)")
    parser.add_argument("--out", help="also write the rows as JSON here")


def run(args: argparse.Namespace) -> int:
    import torch  # (imported here: see _timeit)

    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:
            print("bench_kernels: without CUDA, set TRITON_INTERPRET=1 before importing triton",
                  file=sys.stderr)
            return 2
        os.environ["TRITON_INTERPRET"] = "1"
    dev = torch.device("cuda" if cuda else "cpu")
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if not cuda:
        dt = torch.float32                                   # the interpreter's bf16 is wrong
    sizes = SHAPES[args.shapes] if cuda else SMOKE
    if args.ctx:
        sizes = replace(sizes, ctx=args.ctx)
    iters = args.iters if cuda else 1
    rows = []
    print(f"{'op':<18} {'impl':<24} {'ms':>9} {'TFLOP/s':>8} {'GB/s':>8} {'% peak':>7}")
    for make in (_gdn_cases, _conv_cases, _attention_cases, _pointwise_cases, _kept_cases):
        for case in make(sizes, dev, dt):
            try:
                sec = _timeit(case.fn, cuda, iters)
            except Exception as exc:                    # a baseline's API may have moved
                print(f"{case.op:<18} {case.impl:<24} failed: {type(exc).__name__}: {exc}")
                rows.append({"op": case.op, "impl": case.impl, "error": repr(exc)})
                continue
            tflops = case.flops / sec / 1e12
            gbps = case.nbytes / sec / 1e9
            peak = (tflops / args.peak_tflops if case.flops and args.peak_tflops else
                    gbps / args.peak_gbps if args.peak_gbps else 0.0)
            rows.append({"op": case.op, "impl": case.impl, "ms": sec * 1e3, "tflops": tflops,
                         "gbps": gbps, "fraction_of_peak": peak})
            print(f"{case.op:<18} {case.impl:<24} {sec * 1e3:9.3f} {tflops:8.2f} {gbps:8.1f} "
                  f"{peak * 100:6.1f}%")
    if args.out:
        device = torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)"
        with open(args.out, "w") as f:
            json.dump({"device": device, "dtype": str(dt), "sizes": asdict(sizes), "rows": rows},
                      f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_kernels", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

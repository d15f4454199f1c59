"""One decode step's attention over a long context on the CPU: the C kernel
(kernels/paged_attention/cpu.c) against torch's fused kernel, per layer.

    python -m ckptd.tools.bench.decode_attention [--contexts 7060,65536] [--threads 2]
        [--repeats 15]

SmolLM2's heads (9 query, 3 kv, head dim 64, pages of 16 tokens), one sequence whose
pages are either consecutive or scattered over the pool (a long-running daemon's pool
after many requests). The two paths alternate, --repeats rounds of 5 calls each, and
the best and median round are reported in ms per layer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from ckptd.kernels.paged_attention import cpu, layout, sdpa


def measure(n: int, scattered: bool, repeats: int) -> dict:
    Hq, Hkv, D, B = 9, 3, 64, 16
    P = -(-n // B)
    pool = layout.new_pool(P, (1, 2, B, Hkv, D), torch.float32, torch.device("cpu"), True)
    layout.head_major(pool).normal_()
    table = (torch.randperm(P) if scattered else torch.arange(P)).to(torch.int32)[None]
    q, lens = torch.randn(1, Hq, D), torch.tensor([n], dtype=torch.int32)
    lib, times = cpu.library.lib, {"C": [], "torch": []}
    try:
        for _ in range(repeats):
            for name, use in (("C", lib), ("torch", None)):
                cpu.library.lib = use
                t = time.perf_counter()
                for _ in range(5):
                    sdpa.paged_decode_attention(q, pool, 0, table, lens, D ** -0.5)
                times[name].append((time.perf_counter() - t) / 5 * 1e3)
    finally:
        cpu.library.lib = lib
    return {"context": n, "scattered": scattered,
            **{f"{k}_best_ms": round(min(v), 3) for k, v in times.items()},
            **{f"{k}_median_ms": round(statistics.median(v), 3) for k, v in times.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptd.tools.bench.decode_attention",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", default="7060,65536")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args(argv)
    if not cpu.available():
        print("decode_attention: the C kernel does not build here (no cc?)", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    for n in (int(x) for x in args.contexts.split(",")):
        for scattered in (False, True):
            print(measure(n, scattered, args.repeats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Decode throughput of the runner, CUDA graphs against eager launches.

    python -m ckptd.tools.bench.decode --model a3b --layers 8 --batches 1,8,32 \
        [--context 1024[,65536]] [--steps 32] [--device cuda] [--threads N] \
        [--random-kv] [--kv-dtype auto|float16] [--json OUT]

Each batch size and context: that many sequences of --context random tokens are
prefilled (or, with --random-kv, their KV pages filled with random values: a decode
step's cost does not depend on the values, and a 64K prefill takes minutes on a CPU),
then --steps decode steps of all of them are timed (after two untimed ones, which
capture the graph). Reported: ms per step (median) and tokens/s, with graphs and with
--enforce-eager's path, through Runner.step as the engine calls it (the logits' copy to
the host, the step's one sync, included); the process's CPU-seconds per step, which a
shared machine's load distorts less than the wall time; and the 1-minute load.
--kv-dtype float16 keeps the attention KV in fp16 (the daemon's --kv-dtype).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from ckptd.daemon.config import KV_DTYPES
from ckptd.model.kept_swap import use_gemv_activations
from ckptd.model.loader import use_kv_dtype
from ckptd.model.placement import resolve
from ckptd.model.runner import Runner
from ckptd.model.sequence import Sequence
from ckptd.tools.bench.cache import _load


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="a3b", help="a3b (random weights), tiny-hybrid, smollm2")
    p.add_argument("--layers", type=int, default=8, help="layers of the a3b-shaped model")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--context", default="1024", help="tokens before the decode (comma list)")
    p.add_argument("--random-kv", action="store_true",
                   help="random KV pages instead of a prefill (attention-only models)")
    p.add_argument("--threads", type=int, help="torch/OpenMP threads (default: torch's)")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-dtype", default="auto", choices=KV_DTYPES,
                   help="the attention KV's dtype (auto: the compute dtype)")
    p.add_argument("--gemv-activations", default="fp32", choices=("fp32", "q8"),
                   help="the kept Q4_0 / Q4_1 / Q8_0 matmuls' input: fp32 or int8")
    p.add_argument("--json", help="write the rows here")


def _model(args, where):
    model = _load(args.model, Path("/tmp/ckptd-bench-decode"), where, args.layers)[0]
    use_kv_dtype(model, None if args.kv_dtype == "auto" else getattr(torch, args.kv_dtype))
    use_gemv_activations(model, args.gemv_activations)
    return model


def bench(model, batch: int, context: int, steps: int, graphs: bool,
          random_kv: bool = False) -> dict:

    B = 16
    per_seq = -(-(context + steps + 4) // B)
    runner = Runner(model, num_pages=batch * per_seq, num_cells=batch, block_size=B,
                    max_batch_tokens=max(batch, 1 if random_kv else context), graphs=graphs,
                    max_seq_pages=per_seq)
    gen = torch.Generator().manual_seed(batch)
    seqs = []
    for i in range(batch):
        vocab = min(30_000, model.config.vocab_size)
        s = Sequence(torch.randint(3, vocab, (context,), generator=gen).tolist())
        runner.attach(s)
        s.pages = list(range(i * per_seq, (i + 1) * per_seq))
        if random_kv:
            _random_pages(runner, s, context, gen)
        else:
            runner.step([(s, context)])
        seqs.append(s)
    times = []
    for t in range(steps + 2):
        if t == 2:
            cpu0 = time.process_time()
        for s in seqs:
            s.tokens.append(3 + t % 5)
        t0 = time.perf_counter()
        runner.step([(s, 1) for s in seqs])
        times.append(time.perf_counter() - t0)
    cpu_ms = (time.process_time() - cpu0) / steps * 1e3
    ms = sorted(times[2:])[len(times[2:]) // 2] * 1e3
    return {"batch": batch, "graphs": graphs, "ms_per_step": round(ms, 3),
            "cpu_ms_per_step": round(cpu_ms, 3), "tokens_per_s": round(batch / ms * 1e3, 1),
            "threads": torch.get_num_threads(), "load_1min": round(os.getloadavg()[0], 1)}


def _random_pages(runner: Runner, seq: Sequence, context: int, gen: torch.Generator) -> None:
    """seq's first `context` tokens computed, their KV random (no recurrent layers)."""
    if runner.state.ssm is not None:
        raise ValueError("--random-kv needs a model without recurrent layers (smollm2)")
    used = -(-context // runner.block_size)
    for p in seq.pages[:used]:
        page = runner.state.kv[p]
        page.copy_(torch.randn(page.shape, generator=gen))
    seq.num_computed = context


def run(args) -> int:

    where = resolve(args.device, args.dtype)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    contexts = [int(c) for c in args.context.split(",") if c.strip()]
    if (not batches or not contexts or min(batches) < 1 or args.steps < 1
            or min(contexts) < 1):
        raise ValueError("--batches, --steps and --context must be positive")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = _model(args, where)
    rows = []
    for context in contexts:
        for batch in batches:
            for graphs in ((True, False) if where.device.type == "cuda" else (False,)):
                rows.append({"model": args.model, "device": str(where), "context": context,
                             "kv_dtype": str(model.state_spec(16).kv_dtype).removeprefix(
                                 "torch."),
                             **bench(model, batch, context, args.steps, graphs,
                                     args.random_kv)})
                print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_decode", description=__doc__.split("\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""Decode throughput of the runner, CUDA graphs against eager launches.

    python -m ckptd.tools.bench.decode --model a3b --layers 8 --batches 1,8,32 \
        [--context 1024] [--steps 32] [--device cuda] [--json OUT]

Each batch size: that many sequences of --context random tokens are prefilled, then
--steps decode steps of all of them are timed (after two untimed ones, which capture
the graph). Reported: ms per step and tokens/s, with graphs and with --enforce-eager's
path, through Runner.step as the engine calls it (the logits' copy to the host, the
step's one sync, included).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from ckptd.model.placement import resolve
from ckptd.model.runner import Runner
from ckptd.model.sequence import Sequence
from ckptd.tools.bench.cache import _load


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="a3b", help="a3b (random weights), tiny-hybrid, smollm2")
    p.add_argument("--layers", type=int, default=8, help="layers of the a3b-shaped model")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--json", help="write the rows here")


def _model(args, where):
    return _load(args.model, Path("/tmp/ckptd-bench-decode"), where, args.layers)[0]


def bench(model, batch: int, context: int, steps: int, graphs: bool) -> dict:

    B = 16
    per_seq = -(-(context + steps + 4) // B)
    runner = Runner(model, num_pages=batch * per_seq, num_cells=batch, block_size=B,
                    max_batch_tokens=max(context, batch), graphs=graphs,
                    max_seq_pages=per_seq)
    gen = torch.Generator().manual_seed(batch)
    seqs = []
    for i in range(batch):
        vocab = min(30_000, model.config.vocab_size)
        s = Sequence(torch.randint(3, vocab, (context,), generator=gen).tolist())
        runner.attach(s)
        s.pages = list(range(i * per_seq, (i + 1) * per_seq))
        runner.step([(s, context)])
        seqs.append(s)
    times = []
    for t in range(steps + 2):
        for s in seqs:
            s.tokens.append(3 + t % 5)
        t0 = time.perf_counter()
        runner.step([(s, 1) for s in seqs])
        times.append(time.perf_counter() - t0)
    ms = sorted(times[2:])[len(times[2:]) // 2] * 1e3
    return {"batch": batch, "graphs": graphs, "ms_per_step": round(ms, 3),
            "tokens_per_s": round(batch / ms * 1e3, 1)}


def run(args) -> int:

    where = resolve(args.device, args.dtype)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    if not batches or min(batches) < 1 or args.steps < 1 or args.context < 1:
        raise ValueError("--batches, --steps and --context must be positive")
    model = _model(args, where)
    rows = []
    for batch in batches:
        for graphs in ((True, False) if where.device.type == "cuda" else (False,)):
            rows.append({"model": args.model, "device": str(where), "context": args.context,
                         **bench(model, batch, args.context, args.steps, graphs)})
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

"""Prefill and decode speed of ckptd's engine against transformers on the same weights.

    python -m ckptd.tools.bench.model [--prefill 512] [--decode 32] [--repeat 2] [--json FILE]

Cases: the embedded SmolLM2-135M (its GGUF dequantized by each engine) in fp32
and bf16, and a tiny random Qwen3.5-style hybrid written by make_tiny. Both
engines run in this process, one after the other, on the same threads; each
figure is the best of --repeat runs after a warm-up. The last prompt position's
logits of the two engines are compared, to show they run the same weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch

from ckptd.cache.manager import CacheManager
from ckptd.model.default import default_model_path
from ckptd.model.loader import load_model
from ckptd.model.runner import Runner
from ckptd.tools.make_tiny import make_tiny


@dataclass(frozen=True)
class Figure:
    case: str
    engine: str             # "ckptd" or "transformers"
    prefill_tokens: int
    prefill_tps: float
    decode_tokens: int
    decode_tps: float
    max_logit_diff: float   # against the other engine, at the last prompt position


def add_arguments(p) -> None:
    p.add_argument("--prefill", type=int, default=512, help="prompt tokens")
    p.add_argument("--decode", type=int, default=32, help="generated tokens (greedy)")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--cases", default="smollm2-fp32,smollm2-bf16,tiny-hybrid")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--json", help="also write the figures here")


def run(args) -> int:
    if args.prefill <= 0 or args.decode <= 0 or args.repeat <= 0:
        raise ValueError("--prefill, --decode and --repeat must be positive")
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - {"smollm2-fp32", "smollm2-bf16", "tiny-hybrid"}
    if unknown:
        raise ValueError(f"unknown case(s): {', '.join(sorted(unknown))}")
    if args.threads is not None:
        if args.threads <= 0:
            raise ValueError("--threads must be positive")
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", file=sys.stderr)
    figures: list[Figure] = []
    _print_header()
    smol = [c for c in cases if c.startswith("smollm2")]
    if smol:
        ours, peer = _load_smollm2()
        for case in smol:        # fp32 first: converting to bf16 is one way
            dtype = torch.bfloat16 if case.endswith("bf16") else torch.float32
            figures += _bench_pair(case, ours.to(dtype), peer.to(dtype), args)
    if "tiny-hybrid" in cases:
        figures += _bench_pair("tiny-hybrid", *_load_tiny_hybrid(), args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(x) for x in figures], f, indent=2)
    return 0


def _load_smollm2():
    from transformers import AutoModelForCausalLM  # the peer: extra test


    path = default_model_path()
    t = time.perf_counter()
    ours = load_model(path)
    print(f"ckptd loaded {path.name} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    t = time.perf_counter()
    peer = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                dtype=torch.float32).eval()
    print(f"transformers loaded it in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return ours, peer


def _load_tiny_hybrid():
    from transformers import AutoModelForCausalLM  # the peer: extra test


    folder = make_tiny("qwen3_5_text", tempfile.mkdtemp(prefix="ckptd-bench-"))
    return load_model(folder), AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32).eval()


def _bench_pair(case: str, ours, peer, args) -> list[Figure]:
    vocab = ours.config.vocab_size
    ids = torch.randint(0, vocab, (args.prefill,), generator=torch.Generator().manual_seed(0))
    ids = ids.tolist()
    print(f"{case}: warming up", file=sys.stderr)
    # the whole prompt: the first call of a shape pays one-time costs (allocator, oneDNN
    # plans) that a 32-token warm-up does not, ~10x the steady prefill time here
    _ours(ours, ids, 2)
    _peer(peer, ids, 2)
    best = {}
    for engine, fn, model in (("ckptd", _ours, ours), ("transformers", _peer, peer)):
        runs = [fn(model, ids, args.decode) for _ in range(args.repeat)]
        best[engine] = (min(r[0] for r in runs), min(r[1] for r in runs), runs[0][2])
    diff = (best["ckptd"][2] - best["transformers"][2]).abs().max().item()
    figures = [Figure(case, engine, args.prefill, args.prefill / pre, args.decode,
                      args.decode / dec, diff) for engine, (pre, dec, _) in best.items()]
    for x in figures:
        print(f"{x.case:<14} {x.engine:<13} {x.prefill_tps:>14.1f} {x.decode_tps:>13.1f} "
              f"{x.max_logit_diff:>13.2e}", flush=True)
    return figures


def _ours(model, ids: list[int], n_decode: int) -> tuple[float, float, torch.Tensor]:
    """(prefill seconds, decode seconds, last prompt logits) through the runner."""

    B = 16
    pages = -(-(len(ids) + n_decode) // B) + 1
    runner = Runner(model, num_pages=pages, num_cells=1, block_size=B,
                    max_batch_tokens=len(ids))
    cache = CacheManager(runner, runner.spec, pages, model.fingerprint)   # pages only
    seq, _ = cache.start(ids)
    t0 = time.perf_counter()
    cache.prepare([(seq, len(ids))])
    logits = runner.step([(seq, len(ids))])[0]
    t1 = time.perf_counter()
    first = logits
    for _ in range(n_decode):
        seq.tokens.append(int(logits.argmax()))
        cache.prepare([(seq, 1)])
        logits = runner.step([(seq, 1)])[0]
    t2 = time.perf_counter()
    cache.release(seq)
    return t1 - t0, t2 - t1, first


@torch.inference_mode()
def _peer(model, ids: list[int], n_decode: int) -> tuple[float, float, torch.Tensor]:
    """The same through transformers' forward with its own KV / recurrent cache."""
    t0 = time.perf_counter()
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    t1 = time.perf_counter()
    first = out.logits[0, -1].float()
    logits, cache = out.logits[0, -1], out.past_key_values
    for _ in range(n_decode):
        out = model(input_ids=logits.argmax().view(1, 1), past_key_values=cache, use_cache=True)
        logits, cache = out.logits[0, -1], out.past_key_values
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, first


def _print_header() -> None:
    print(f"{'case':<14} {'engine':<13} {'prefill tok/s':>14} {'decode tok/s':>13} "
          f"{'max |dlogit|':>13}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckptd.tools.bench.model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except ValueError as e:
        print(f"bench_model: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

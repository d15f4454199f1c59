"""Time to first token by context length, in process: cold, then warm from each tier.

    python -m ckptd.tools.bench.cache [--lengths 1024,2048,...,65536] [--models tiny-hybrid,smollm2]
                                [--out DIR] [--repeat 3] [--question 16] [--interval 1024]

For each model and length L, on a fresh store: a context of L tokens (English
text) followed by a short question. Each phase asks a different question, so
only the context can come from the cache:

    cold    nothing cached: the whole prompt is computed
    device  the same engine: the context's pages are still on the device (a
            hybrid's recurrent snapshot is copied from RAM)
    host    the device pages dropped: the context comes from RAM
    disk    a restart (new store object on the same folder, host budget 0, OS
            page cache dropped when permitted): the context comes from disk

TTFT is measured from admission (lookup and restore included) to the first
sampled token, through Engine + Runner + CacheStore as the daemon runs them.
Warm phases are the best of --repeat runs (each with a new question, the disk
phase with a restart each time); the cold one runs once.
Bytes per token are the store's after the cold run (snapshots included), on
disk (compressed) and in RAM (logical). Writes report.md, results.json and
ttft_by_length.png into --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ckptd.cache.manager import CacheManager
from ckptd.cache.store import CacheStore
from ckptd.cache.work import Work
from ckptd.model.default import default_model_path
from ckptd.model.loader import load
from ckptd.model.placement import resolve
from ckptd.model.runner import Runner
from ckptd.model.sequence import Sequence
from ckptd.tools.bench.shapes import a3b_config, random_model
from ckptd.tools.bench.store import drop_caches, english_text
from ckptd.tools.make_tiny import make_tiny

MODELS = ("tiny-hybrid", "smollm2", "a3b")     # a3b: random weights (bench/shapes.py)
LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
PHASES = ("cold", "device", "host", "disk")


@dataclass
class Row:
    model: str
    length: int                         # context tokens
    prompt: int                         # context + question
    ttft_ms: dict[str, float] = field(default_factory=dict)     # by phase (best run)
    restore_ms: dict[str, float] = field(default_factory=dict)  # of the best run
    cpu_ms: dict[str, float] = field(default_factory=dict)      # process CPU, the best run
    cached: dict[str, int] = field(default_factory=dict)        # tokens restored, by phase
    tier: dict[str, str | None] = field(default_factory=dict)   # slowest tier read, by phase
    stored_per_token: float = 0.0       # bytes on disk per prompt token
    logical_per_token: float = 0.0      # uncompressed bytes per prompt token
    page_cache_dropped: bool = False
    snapshot_bytes: dict[str, int] = field(default_factory=dict)  # the cold run's, by role

    def ratio(self, phase: str) -> float | None:
        warm = self.ttft_ms.get(phase)
        return self.ttft_ms["cold"] / warm if warm else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)),
                   help="context lengths in tokens, comma-separated (multiples of the block size)")
    p.add_argument("--models", default=",".join(MODELS), help=f"any of {', '.join(MODELS)}")
    p.add_argument("--out", default="bench-cache", help="folder for the report and plot")
    p.add_argument("--repeat", type=int, default=3, help="runs of each warm phase (best kept)")
    p.add_argument("--question", type=int, default=16, help="question tokens after the context")
    p.add_argument("--interval", type=int, default=1024, help="snapshot interval (tokens)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--step-tokens", type=int, default=2048, help="prefill chunk (tokens)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto", help="auto, bfloat16, float16 or float32")
    p.add_argument("--layers", type=int, default=8,
                   help="layers of the a3b-shaped model (the real one has 40)")
    p.add_argument("--anchors", action="store_true",
                   help="prompts carry a chat's anchors (the question's start, the "
                        "generation prompt 3 tokens before the end) instead of tails")
    p.add_argument("--no-tails", action="store_true",
                   help="raw prompts leave no tail snapshots (to measure what they cost)")
    p.add_argument("--store-dir", help="where the stores go (default: a temporary folder)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--keep-page-cache", action="store_true",
                   help="don't drop the OS page cache before the disk phase (it is "
                        "machine-wide: other processes slow down while it refills)")


def run(args: argparse.Namespace) -> int:
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    models = [m for m in args.models.split(",") if m]
    if not lengths or any(n <= 0 or n % args.block_size for n in lengths):
        raise ValueError(f"--lengths must be positive multiples of --block-size "
                         f"({args.block_size})")
    if set(models) - set(MODELS) or not models:
        raise ValueError(f"--models takes {', '.join(MODELS)}")
    if args.question <= 0 or args.repeat <= 0:
        raise ValueError("--question and --repeat must be positive")
    if args.interval <= 0 or args.interval % args.block_size:
        raise ValueError("--interval must be a positive multiple of --block-size")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    where = resolve(args.device, args.dtype)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = Path(args.store_dir or tempfile.mkdtemp(prefix="ckptd-bench-cache-"))
    rows: list[Row] = []
    try:
        for name in models:
            model, tok = _load(name, root, where, args.layers)
            limit = model.config.max_position_embeddings - args.question
            _warm_up(model, min(min(lengths), limit), args)
            for n in lengths:
                if n > limit:
                    print(f"{name}: {n} tokens is past the model's context, skipped",
                          file=sys.stderr)
                    continue
                rows.append(_bench(name, model, tok, n, root / f"{name}-{n}", args))
                print(_line(rows[-1]), file=sys.stderr, flush=True)
    finally:
        if not args.store_dir:
            shutil.rmtree(root, ignore_errors=True)
    (out / "results.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    (out / "report.md").write_text(markdown(rows))
    if not args.no_plot and rows:
        plot(rows, out / "ttft_by_length.png")
    print(markdown(rows))
    return 0


def _load(name: str, root: Path, where, layers: int):
    """(model, tokenizer); a random-weight model has no tokenizer (random ids)."""

    if name == "a3b":
        return random_model(a3b_config(layers), where.dtype, where.device), None
    if name == "smollm2":
        return load(default_model_path(), where.dtype, where.device)
    return load(make_tiny("qwen3_5_text", root / "tiny-hybrid-model"), where.dtype,
                where.device)


def _warm_up(model, n: int, args) -> None:
    """Run the chunk shapes the cold phase will (prefill chunks, then a question) once:
    the first call of a shape pays one-time costs (allocator, oneDNN plans) that
    would otherwise land in the first cold figure."""

    B = args.block_size
    pages = -(-(n + args.question) // B) + 1
    runner = Runner(model, num_pages=pages, num_cells=1, block_size=B,
                    max_batch_tokens=args.step_tokens)
    cache = CacheManager(runner, runner.spec, pages, model.fingerprint)   # pages only
    ids = torch.randint(3, model.config.vocab_size, (n + args.question,),
                        generator=torch.Generator().manual_seed(0)).tolist()
    seq, _ = cache.start(ids)
    for size in (min(args.interval, args.step_tokens), args.step_tokens, args.question):
        size = min(size, len(ids) - seq.num_computed)
        if size > 0:
            cache.prepare([(seq, size)])
            runner.step([(seq, size)])
    cache.release(seq)


def _tokens(tok, n: int) -> list[int]:
    """n tokens of English text (repeated when the text runs out); random ids where the
    model has no tokenizer."""

    if tok is None:
        return torch.randint(3, 100_000, (n,), generator=torch.Generator().manual_seed(n),
                             device="cpu").tolist()
    ids = tok.encode(english_text(8 * n))
    return (ids * -(-n // len(ids)))[:n]


def _bench(name: str, model, tok, n: int, path: Path, args) -> Row:

    B, q = args.block_size, args.question
    context = _tokens(tok, n)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(n)
    row = Row(name, n, n + q)
    pages = -(-(n + q) // B) * 2 + 4
    runner = Runner(model, num_pages=pages, num_cells=2, block_size=B,
                    max_batch_tokens=args.step_tokens)

    def manager(**options) -> CacheManager:
        store = CacheStore(path, runner.spec, model.fingerprint, **options)
        return CacheManager(runner, runner.spec, pages, model.fingerprint, store,
                            snapshot_interval=args.interval, step_tokens=args.step_tokens)

    eng = manager()
    for phase in PHASES:
        for _ in range(1 if phase == "cold" else args.repeat):
            if phase == "host":
                eng.device.evict_cached()
            if phase == "disk":
                eng.close()
                row.page_cache_dropped = not args.keep_page_cache and drop_caches()
                eng = manager(host_budget=0)
            question = torch.randint(3, vocab, (q,), generator=gen).tolist()
            before, cpu = dict(eng.checkpoints.snapshot_bytes), time.process_time()
            anchors = (n, n + q - 3) if args.anchors else ()
            seconds, info = first_token(eng, runner, context + question, args.step_tokens,
                                        anchors, tails=not (anchors or args.no_tails))
            cpu = time.process_time() - cpu
            if phase == "cold":
                now = eng.checkpoints.snapshot_bytes
                row.snapshot_bytes = {r: n - before.get(r, 0) for r, n in now.items()
                                      if n > before.get(r, 0)}
            if seconds * 1000 < row.ttft_ms.get(phase, float("inf")):
                row.ttft_ms[phase], row.restore_ms[phase] = seconds * 1000, info.restore_ms
                row.cpu_ms[phase] = cpu * 1000
                row.cached[phase], row.tier[phase] = info.cached_tokens, info.tier
        if phase == "cold":
            eng.rates.update_prefill(n + q, row.ttft_ms["cold"] / 1000)   # plan by cost
            eng.store_pending()
            eng.store.flush()
            disk = eng.store.stats()["disk"]
            row.stored_per_token = disk["stored_bytes"] / (n + q)
            row.logical_per_token = disk["logical_bytes"] / (n + q)
    eng.close()
    return row


def first_token(cache, runner, tokens: list[int], step: int, anchors: tuple[int, ...] = (),
                tails: bool = True):
    """(seconds from admission to the first sampled token, RestoreInfo), through the
    cache manager and the runner as the engine's loop drives them. anchors: a chat's
    (which leaves no tails: daemon/prompt.py); tails: a raw prompt's."""

    t0 = time.perf_counter()
    seq = Sequence(list(tokens))
    info = cache.restore(seq, anchors=anchors, tails=tails)
    work = Work(seq, cache.chunk(seq, step), new=True, restored=info)
    cache.admit([work])
    logits = info.logits
    while logits is None:
        out = runner.run([(seq, work.n)])
        cache.after_step([work], out)
        if seq.num_computed == len(tokens):
            logits = out.last(seq)
        else:
            work = Work(seq, cache.chunk(seq, step))
            cache.admit([work])
    int(logits.argmax())                  # the first token (greedy; logits are on the host)
    seconds = time.perf_counter() - t0
    cache.finish(seq, checkpoint=False)
    cache.store_pending()       # the prompt's checkpoint, stored outside the timing
    return seconds, info


def _line(r: Row) -> str:
    return (f"{r.model} {r.length}: " + ", ".join(f"{p} {r.ttft_ms[p]:.1f} ms"
                                                 for p in PHASES))


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:,.1f}"


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:,.1f}×"


def markdown(rows: list[Row]) -> str:
    lines = [
        "| model | context | cold ms | cold CPU ms | device ms | host ms | disk ms | "
        "cold/device | cold/host | cold/disk | disk B/token | RAM B/token |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        t = r.ttft_ms
        lines.append(f"| {r.model} | {r.length:,} | {_ms(t.get('cold'))} | "
                     f"{_ms(r.cpu_ms.get('cold'))} | {_ms(t.get('device'))} | "
                     f"{_ms(t.get('host'))} | {_ms(t.get('disk'))} | "
                     f"{_x(r.ratio('device'))} | {_x(r.ratio('host'))} | "
                     f"{_x(r.ratio('disk'))} | {r.stored_per_token:,.0f} | "
                     f"{r.logical_per_token:,.0f} |")
    notes = sorted({f"{r.model}: restored {r.cached['disk']:,} of {r.prompt:,} tokens at "
                    f"{r.length:,}" for r in rows if r.cached.get("disk") != r.length})
    dropped = all(r.page_cache_dropped for r in rows)
    lines += ["", f"TTFT: admission to first token, {torch.get_num_threads()} torch threads "
              "(CPU: the process's, all threads); "
              "device: a hybrid's snapshot still comes from RAM. Disk phase: OS page cache "
              f"{'dropped' if dropped else 'NOT dropped'}."]
    lines += [f"- {n} (the restore point is the last snapshot)" for n in notes]
    lines += ["", "Snapshot bytes the cold request captured, by role (tail: issue 35's):"]
    lines += [f"- {r.model} {r.length:,}: " + ", ".join(
        f"{role} {n:,}" for role, n in sorted(r.snapshot_bytes.items())) for r in rows]
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib  # optional (extra bench)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after choosing the backend

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for name in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == name]
        xs = [r.length for r in mine]
        for phase, style in zip(PHASES, ("o-", "s--", "^-.", "v:")):
            a1.plot(xs, [r.ttft_ms[phase] for r in mine], style, label=f"{name}: {phase}")
        for phase, style in zip(PHASES[1:], ("s--", "^-.", "v:")):
            a2.plot(xs, [r.ratio(phase) for r in mine], style, label=f"{name}: cold/{phase}")
    a1.set(xlabel="context (tokens)", ylabel="time to first token (ms)", xscale="log",
           yscale="log", title="TTFT by context length")
    a2.set(xlabel="context (tokens)", ylabel="cold TTFT / warm TTFT", xscale="log",
           yscale="log", title="Speed-up from the cache")
    for a in (a1, a2):
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckptd.tools.bench.cache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except ValueError as e:
        print(f"bench_cache: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Admission overhead at long prompts: the cache's bookkeeping between taking a request
off the queue and its first model step.

    python -m ckptd.tools.bench.admission [--lengths 16384,65536,262144] [--snapshots 250]
                                          [--repeat 5] [--why-cost] [--json FILE]

For each length L, a store is filled as a long prefill leaves it, without running
the model: the tiny hybrid's state shapes, every block of an L-token context (random
KV) and `--snapshots` snapshots spread over it plus one at its end. Then questions
of 20 new tokens after the context are admitted the way the engine does it (the
scheduler hashes the prompt's block keys once, restores the sequence (cache.restore)
and decides its first chunk; `cache.admit` gives the pages for it), each phase with
new questions:

    device  the context's pages are still on the device: nothing is read but the
            snapshot, from RAM. This is the bookkeeping alone.
    host    the device pages dropped: the blocks are copied from RAM.
    disk    a restart (a new store on the same folder, RAM budget 0): the blocks
            are read from LMDB (the OS page cache is not dropped).

Reported per phase: the median time of keys + admit (ms), and of the keys alone.

In the host and disk phases the device's pages are dropped before each question:
evict_record_us_per_page is what recording those departures costs (DevicePages.on_evict:
which pages the store lacks; here it holds them all, as it mostly does), per page.

--why-cost: the cost of explaining each restore (cache/why/: the miss reason, its
counts, the report), side by side in the same run: every question is paired with
one admitted with the explanation skipped (the ledger's report not made), in
alternating order, and the time inside the report calls is measured too (why_us:
what admission pays; explain_us: explaining a filed report, which a reader does
later, off the engine's thread). Before each
admission the heap is collected and frozen, as the daemon does between requests
(daemon/gc_pacer.py), so that a collector pass does not land in one of the two.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from ckptd.cache.manager import CacheManager
from ckptd.cache.snapshot import Snapshot
from ckptd.cache.store import CacheStore
from ckptd.cache.work import Work
from ckptd.model.loader import load_model
from ckptd.model.runner import Runner
from ckptd.model.sequence import Sequence
from ckptd.tools.make_tiny import make_tiny

QUESTION = 20
B = 16


def _fill(store, spec, context: list[int], n_snapshots: int) -> None:

    n_blocks = len(context) // B
    chain = store.chain(context)
    for first in range(0, n_blocks, 1024):
        n = min(1024, n_blocks - first)
        pages = torch.randn((n, *spec.kv_shape())).to(spec.attention.dtype)
        store.put_blocks(context, first, pages, chain=chain)
    gap = len(context) // n_snapshots // B * B

    def snap() -> Snapshot:
        return Snapshot(conv=torch.randn(spec.conv_shape()).to(spec.recurrent.conv_dtype),
                        ssm=torch.randn(spec.ssm_shape()))
    for i in range(1, n_snapshots + 1):
        store.put_snapshot(context[:i * gap], snap(), chain=chain)
    if len(context) % gap:
        store.put_snapshot(context, snap(), chain=chain)
    store.flush()


def _admit(cache, tokens: list[int]) -> tuple[float, float, int]:
    """(ms for keys + admit, ms for the keys, tokens restored) of one new request."""

    t0 = time.perf_counter()
    chain = cache.chain(tokens, None)
    t1 = time.perf_counter()
    seq = Sequence(tokens)
    info = cache.restore(seq, chain)
    cache.admit([Work(seq, cache.chunk(seq, 256), new=True, restored=info)])
    t2 = time.perf_counter()
    cache.finish(seq, checkpoint=False)
    return (t2 - t0) * 1000, (t1 - t0) * 1000, info.cached_tokens


@contextlib.contextmanager
def _without_why(ledger):
    """Restores not explained: the ledger's report is skipped (an instance attribute
    over the method)."""
    ledger.report = lambda *args: None
    try:
        yield
    finally:
        del ledger.report


@contextlib.contextmanager
def _timed_evictions(device, seconds: list[float], pages: list[int]):
    """The time the device's eviction records take (DevicePages.on_evict: which of the
    pages the store lacks, and their departures), appended to `seconds`, with the pages
    each call was given."""
    record = device.on_evict

    def timed(rows, why):
        t0 = time.perf_counter()
        try:
            record(rows, why)
        finally:
            seconds.append(time.perf_counter() - t0)
            pages.append(len(rows))
    device.on_evict = timed
    try:
        yield
    finally:
        device.on_evict = record


@contextlib.contextmanager
def _timed_why(ledger, seconds: list[float]):
    """The time inside each report call, appended to `seconds`."""
    report = ledger.report

    def timed(*args):
        t0 = time.perf_counter()
        try:
            return report(*args)
        finally:
            seconds.append(time.perf_counter() - t0)
    ledger.report = timed
    try:
        yield
    finally:
        del ledger.report


def bench(length: int, n_snapshots: int, repeat: int, root: Path, model,
          why_cost: bool = False) -> dict:
    gen = torch.Generator().manual_seed(length)
    vocab = model.config.vocab_size
    context = torch.randint(3, vocab, (length,), generator=gen).tolist()
    pages = length // B + 64
    runner = Runner(model, pages, 2, B)
    path = root / f"store-{length}"
    budget = {"disk_budget": 64 << 30, "host_budget": 16 << 30}

    def manager(**options):
        store = CacheStore(path, runner.spec, model.fingerprint, **{**budget, **options})
        return CacheManager(runner, runner.spec, pages, model.fingerprint, store,
                            max_snapshots=1 << 20)

    cache = manager()
    t0 = time.perf_counter()
    _fill(cache.store, runner.spec, context, n_snapshots)
    fill_s = time.perf_counter() - t0
    row = {"length": length, "snapshots": n_snapshots, "fill_s": round(fill_s, 1)}

    def questions() -> list[int]:
        return context + torch.randint(3, vocab, (QUESTION,), generator=gen).tolist()

    _admit(cache, questions())                            # the pages land on the device
    for phase in ("device", "host", "disk"):
        if phase == "disk":
            cache.close()
            cache = manager(host_budget=0)
        # the prompts outlive the phase: freeing one (a list of L ints, ~1 ms at 64K) is
        # not the accounting's cost, and a filed report would otherwise be the last to hold it
        runs, bare, why_s, prompts, evict_s, evicted = [], [], [], [], [], []
        for i in range(repeat):
            order = ((True, False) if i % 2 == 0 else (False, True)) if why_cost else (True,)
            for explained in order:
                if phase != "device":
                    with _timed_evictions(cache.device, evict_s, evicted):
                        cache.device.evict_cached()
                if why_cost:
                    gc.collect()
                    gc.freeze()
                ledger = cache.store.why
                prompts.append(questions())
                with _timed_why(ledger, why_s) if explained else _without_why(ledger):
                    (runs if explained else bare).append(_admit(cache, prompts[-1]))
        restored = {r[2] for r in runs}
        ledger = cache.store.why                 # what a reader later does, off the loop
        filed, t0 = max(1, len(ledger.pending)), time.perf_counter()
        ledger.resolve_all()
        row[phase] = {"admit_ms": round(statistics.median(r[0] for r in runs), 3),
                      "keys_ms": round(statistics.median(r[1] for r in runs), 3),
                      "why_us": round(statistics.median(why_s) * 1e6, 1),
                      "explain_us": round((time.perf_counter() - t0) / filed * 1e6, 1),
                      "restored": sorted(restored)}
        if evict_s:           # what the device's departures cost whoever evicts (per page)
            row[phase]["evict_record_us_per_page"] = round(
                sum(evict_s) / max(1, sum(evicted)) * 1e6, 3)
        if why_cost:          # the least too: on a busy machine a median moves with the load
            row[phase].update(
                admit_ms_without_why=round(statistics.median(r[0] for r in bare), 3),
                admit_min_ms=round(min(r[0] for r in runs), 3),
                admit_min_ms_without_why=round(min(r[0] for r in bare), 3))
    cache.close()
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptd.tools.bench.admission",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="16384,65536,262144")
    p.add_argument("--snapshots", type=int, default=250)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--why-cost", action="store_true",
                   help="also admit every question with the miss explanation skipped")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        print(f"admission: --lengths: not a list of integers: {args.lengths!r}", file=sys.stderr)
        return 2
    if any(n < B * args.snapshots for n in lengths) or args.repeat < 1:
        print("admission: each length needs at least 16 tokens per snapshot, --repeat >= 1",
              file=sys.stderr)
        return 2

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = load_model(make_tiny("qwen3_5_text", root / "model"))
        for n in lengths:
            row = bench(n, args.snapshots, args.repeat, root, model, args.why_cost)
            rows.append(row)
            print(f"{n:>7} tokens, {args.snapshots} snapshots: " + ", ".join(
                f"{ph} {row[ph]['admit_ms']:.2f} ms (keys {row[ph]['keys_ms']:.1f}, "
                f"why {row[ph]['why_us']:.0f} us"
                + (f", without {row[ph]['admit_ms_without_why']:.2f} ms"
                   if args.why_cost else "") + ")"
                for ph in ("device", "host", "disk")), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

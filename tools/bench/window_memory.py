"""Device KV memory of a sliding-window model at a long context, window layers against
full ones, and the same context answered from disk after a restart.

    python -m ckptd.tools.bench.window_memory [--context 65536] [--window 1024]
        [--block 16] [--step 2048] [--answer 4] [--out DIR] [--json OUT]

The model is make-tiny's Gemma 3 (6 window layers, 1 full, 2 KV heads of 16) with
Gemma 3's window (--window, 1024) written into its config: shaped like Gemma 3, small
enough that a 64K prefill runs on a CPU, where the KV pool is the device tier (the
runner's pools: cache/device.py, model/window_pages.py). From nothing cached:

    prefill     --context random tokens through the cache manager as the engine
                drives it (admit, step, after_step), --step tokens a step; the
                window pool's rooms in use are read after every step
    question    the context and a question, restored from the device (the context's
                last window kept its rooms), --answer greedy tokens
    uncached    the context and another question, computed without the cache
    restart     a new runner and cache on the same folder with no RAM tier: the
                context and that other question, from disk

The window pool is sized as the daemon sizes it (daemon/memory.py: window_rooms, one
running sequence). Reported: each layer kind's device KV bytes at the context's end
(full layers: every page; window layers: the rooms in use, their most at once, the
pool allocated, and what keeping every page would cost), the phases' wall and CPU
seconds, the restart's restore tier and cached tokens, and whether its answer and last
logits equal the uncached ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from ckptd.cache.manager import CacheManager
from ckptd.cache.store import CacheStore
from ckptd.cache.work import Work
from ckptd.daemon import memory
from ckptd.model.loader import load_model
from ckptd.model.runner import Runner
from ckptd.tools.make_tiny import make_tiny


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--context", type=int, default=65536)
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--step", type=int, default=2048, help="tokens a prefill step")
    p.add_argument("--answer", type=int, default=4, help="greedy tokens answered")
    p.add_argument("--out", help="folder for the model and the store (default: a temp one)")
    p.add_argument("--json", help="write the report here")


def tiny_gemma(out: Path, window: int) -> Path:
    """make-tiny's Gemma 3 with Gemma 3's window (the weights do not depend on it)."""
    folder = out / "model"
    if not (folder / "config.json").exists():
        make_tiny("gemma3", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["sliding_window"] = window
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


class Session:
    """A runner and a cache manager over one store folder, driven as the engine does."""

    def __init__(self, model, store: Path, pages: int, block: int, step: int, **options):
        # the window pool as the daemon sizes it for one running sequence
        rooms = memory.window_rooms(model.state_spec(block), 1, step)
        self.runner = Runner(model, pages, 1, block, max_batch_tokens=step, window_pages=rooms)
        spec = self.runner.spec
        self.cache = CacheManager(self.runner, spec, pages, model.fingerprint,
                                  CacheStore(store, spec, model.fingerprint, **options))
        self.step = step
        self.rooms: list[int] = []

    def compute(self, tokens: list[int], use_cache: bool = True):
        """Restore, then compute the rest: (sequence, restore info, last logits)."""
        cache, runner = self.cache, self.runner
        seq, info = cache.start(tokens, use_cache=use_cache)
        last = info.logits
        while seq.num_computed < len(seq.tokens):
            w = Work(seq, cache.chunk(seq, self.step))
            cache.admit([w])
            if not w.runs:
                raise RuntimeError(f"the step was refused: {w.refused}")
            logits = runner.run([(seq, w.n)])
            cache.after_step([w], logits)
            last = logits.last(seq)
            self.rooms.append(runner.state.rooms.in_use)
        return seq, info, last

    def answer(self, tokens: list[int], n: int, use_cache: bool = True
               ) -> tuple[list[int], torch.Tensor, object]:
        """Greedy `n` tokens after `tokens`: (them, the last logits, the restore info)."""
        seq, info, last = self.compute(tokens, use_cache)
        out = []
        for _ in range(n):
            out.append(int(last.argmax()))
            seq.tokens.append(out[-1])
            w = Work(seq, 1)
            self.cache.admit([w])
            logits = self.runner.run([(seq, 1)])
            self.cache.after_step([w], logits)
            last = logits.last(seq)
        self.cache.finish(seq)
        return out, last, info


def _timed(fn):
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, round(time.perf_counter() - t, 1), round(time.process_time() - c, 1)


def run(args) -> dict:
    out = Path(args.out or tempfile.mkdtemp(prefix="ckptd-window-"))
    out.mkdir(parents=True, exist_ok=True)
    folder = tiny_gemma(out, args.window)
    model = load_model(folder)
    spec = model.state_spec(args.block)
    a = spec.attention
    n_win, n_full = len(a.window_layers), a.n_layers - len(a.window_layers)
    layer_page = spec.page_bytes() // a.n_layers            # one layer's part of a page
    pages = -(-(args.context + 256) // args.block) + 64
    store = out / "store"
    g = torch.Generator().manual_seed(0)
    doc = torch.randint(3, model.config.vocab_size, (args.context,), generator=g).tolist()
    question, other = (torch.randint(3, model.config.vocab_size, (24,), generator=g).tolist()
                       for _ in range(2))

    s = Session(model, store, pages, args.block, args.step)
    rooms = s.runner.state.rooms
    (seq, _, _), prefill_s, prefill_cpu = _timed(lambda: s.compute(doc))
    used_pages = len(seq.pages)
    at_end = rooms.in_use
    s.cache.finish(seq)
    (answer, last, info_q), q_s, q_cpu = _timed(lambda: s.answer(doc + question, args.answer))
    high = rooms.high_water
    # the reference for after the restart: the context and another question, uncached
    (want, last, _), u_s, u_cpu = _timed(lambda: s.answer(doc + other, args.answer, False))
    s.cache.close()

    r = Session(model, store, pages, args.block, args.step, host_budget=0)
    (again, last_r, info_r), r_s, r_cpu = _timed(lambda: r.answer(doc + other, args.answer))
    r.cache.close()
    report = {
        "cpu": _cpu(), "load_1min": os.getloadavg()[0], "context": args.context,
        "window": args.window, "block": args.block, "step": args.step,
        "layers": {"window": n_win, "full": n_full}, "layer_page_bytes": layer_page,
        "device_kv_bytes": {
            "full_layers": used_pages * n_full * layer_page,
            "window_layers_at_end": at_end * n_win * layer_page,
            "window_layers_most": high * n_win * layer_page,
            "window_layers_if_kept": used_pages * n_win * layer_page},
        "pages": used_pages, "rooms_at_end": at_end, "rooms_most": high,
        "rooms_pool": rooms.num_rooms,
        "window_pool_bytes": rooms.num_rooms * n_win * layer_page,
        "rooms_bound": -(-(args.window + 1) // args.block) + 1 + -(-args.step // args.block),
        "prefill": {"wall_s": prefill_s, "cpu_s": prefill_cpu},
        "question": {"wall_s": q_s, "cpu_s": q_cpu, "tier": info_q.tier,
                     "cached": info_q.cached_tokens, "device": info_q.device_tokens,
                     "answer": answer},
        "uncached": {"wall_s": u_s, "cpu_s": u_cpu, "answer": want},
        "restart": {"wall_s": r_s, "cpu_s": r_cpu, "tier": info_r.tier,
                    "cached": info_r.cached_tokens, "answer": again,
                    "same_answer": again == want,
                    "logits_max_diff": (last_r - last).abs().max().item()},
    }
    return report


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0 if report["restart"]["same_answer"] else 1


if __name__ == "__main__":
    sys.exit(main())

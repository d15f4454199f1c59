"""The full-size model served by `ckptd serve`, against a time budget: issue 34's figures
in one run, each phase time-limited, the JSON rewritten after every phase so whatever
finished is kept when a later phase runs long.

    python -m ckptd.tools.bench.full_size --model A3B.gguf --device cuda --budget 400
        [--contexts 250000,32768,131072] [--questions 3] [--answer 32] [--decode 128]
        [--batch 8] [--warmup 512] [--serve-arg=--flag=value ...] [--json OUT.json]
        [--log DAEMON.log] [--pid-file FILE] [--cache-dir DIR]

Phases, most important first, each marked ok / FAILED (its first error) / SKIPPED:

    start        the daemon loads the GGUF (kept weights) onto the device
    warm-up      a short prompt, then --batch at once: Triton compiles, graphs are captured
    decode       tokens/s at batch 1 and at --batch (short prompts, --decode tokens each)
    N cold       the first context (token ids, random in the vocabulary) + a question
    N question i the same context + another question, --questions times
    restart      the writer drained, SIGKILL, a start on the same cache folder, question 1
                 again (from disk), then a new question
    N cold, N question   each further context: cold, then one question

TTFT is the client's (send -> first token); the server's prompt / cached / computed
token counts and cache tier are recorded beside it. Peak device memory: nvidia-smi's
memory.used sampled every 0.5 s (the whole GPU: the daemon is the only process on it),
and the daemon's peak RSS (VmHWM), per phase.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ckptd.tools.bench.big_rss import Sampler, status
from ckptd.tools.bench.client import Client, Measured
from ckptd.tools.bench.long_context import _vocab
from ckptd.tools.bench.managed import ManagedDaemon

KEEP_FOR_RESTART = 60.0     # seconds the restart phase needs beyond a load, at the least


class Peaks(Sampler):
    """Device memory used (nvidia-smi, MiB -> bytes) and the daemon's VmHWM, sampled on
    a thread; `mark(phase)` starts a phase's maxima; `pid` is set once the daemon runs."""

    def __init__(self, cuda: bool, every: float = 0.5) -> None:
        self.cuda, self.phase = cuda, "start"
        self.peaks: dict[str, dict[str, int]] = {}
        super().__init__(None, every)

    def mark(self, phase: str) -> None:
        self.phase = phase

    def _device_used(self) -> int | None:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                                  "--format=csv,noheader,nounits", "-i", "0"],
                                 capture_output=True, text=True, timeout=5).stdout
            return int(out.split()[0]) << 20
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            return None

    def sample(self) -> None:
        got: dict[str, int] = {}
        if self.cuda and (used := self._device_used()) is not None:
            got["device_used"] = used
        if self.pid is not None:
            try:
                s = status(self.pid)
                got["rss"], got["rss_peak"] = s["VmRSS"], s["VmHWM"]
            except (OSError, KeyError):
                pass
        peak = self.peaks.setdefault(self.phase, {})
        for k, v in got.items():
            peak[k] = max(peak.get(k, 0), v)


class Run:
    """The phases' results, written to --json after each one."""

    def __init__(self, args, budget: float) -> None:
        self.args, self.t0, self.budget = args, time.monotonic(), budget
        self.result: dict = {"model": str(args.model), "device": args.device,
                             "file_bytes": Path(args.model).stat().st_size,
                             "serve_args": args.serve_args, "budget_s": budget, "phases": []}

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def save(self) -> None:
        if self.args.json:
            tmp = Path(self.args.json + ".tmp")
            tmp.write_text(json.dumps(self.result, indent=1))
            tmp.replace(self.args.json)

    def phase(self, name: str, fn, need: float = 5.0) -> dict | None:
        """Runs fn() -> dict of figures, recording it as ok, or FAILED with its error;
        SKIPPED when less than `need` seconds are left."""
        row: dict = {"phase": name}
        if self.left() < need:
            row.update(status="SKIPPED", error=f"{self.left():.0f} s left of the budget, "
                       f"{need:.0f} needed")
        else:
            t0 = time.monotonic()
            print(f"[{time.monotonic() - self.t0:6.1f} s] {name} ...", flush=True)
            try:
                row.update(fn())
                row["status"] = "ok"
            except Exception as e:                  # every failure is a result here
                row.update(status="FAILED", error=f"{type(e).__name__}: {e}".splitlines()[0])
            row["seconds"] = round(time.monotonic() - t0, 1)
        self.result["phases"].append(row)
        self.save()
        print(f"  {json.dumps(row)}", flush=True)
        return row if row["status"] == "ok" else None


def _row(m: Measured) -> dict:
    decode_s = (m.total_ms - m.ttft_ms) / 1000
    out = {"ttft_s": round(m.ttft_ms / 1000, 3), "prompt_n": m.prompt_n,
           "cache_n": m.cache_n, "computed_n": m.computed_n, "tier": m.cache_tier,
           "completion_n": m.completion_n}
    if m.completion_n and m.completion_n > 1 and decode_s > 0:
        out["decode_tps"] = round((m.completion_n - 1) / decode_s, 1)
    return out


def _together(client: Client, prompts: list[list[int]], tokens: int) -> dict:
    """The prompts sent at once; aggregate decode tokens/s over the span in which they
    decode (first token of the earliest to the end of the last)."""
    def one(p):
        t0 = time.perf_counter()
        m = client.complete(p, tokens, ignore_eos=True)
        return t0 + m.ttft_ms / 1000, t0 + m.total_ms / 1000, m
    with ThreadPoolExecutor(len(prompts)) as pool:
        done = list(pool.map(one, prompts))
    first, last = min(d[0] for d in done), max(d[1] for d in done)
    n = sum((d[2].completion_n or 0) - 1 for d in done)
    rates = [(d[2].timings or {}).get("predicted_per_second") for d in done]
    return {"batch": len(prompts), "tokens": n + len(done),
            "decode_tps": round(n / max(last - first, 1e-9), 1),
            "per_sequence_tps": [round(r, 1) for r in rates if r],
            "ttft_s_max": round(max(d[2].ttft_ms for d in done) / 1000, 3)}


def _drain(client: Client, cap: float) -> dict:
    """Waits (at most `cap` s) until the cache writer's queue is empty: what SIGKILL
    then loses is nothing the writer was given."""
    t0 = time.monotonic()
    while True:
        code, stats = client.request("GET", "/cache/stats", timeout=10)
        queue = stats.get("write_queue", {}) if isinstance(stats, dict) else {}
        waited = time.monotonic() - t0
        if code == 200 and queue.get("depth", 1) == 0 and queue.get("bytes", 1) == 0:
            disk = stats.get("disk", {})
            return {"drain_s": round(waited, 1), "disk_logical_bytes":
                    disk.get("logical_bytes"), "disk_stored_bytes": disk.get("stored_bytes"),
                    "shed": queue.get("shed"), "dropped": queue.get("dropped")}
        if waited > cap:
            raise TimeoutError(f"write queue not empty after {cap:.0f} s: {queue}")
        time.sleep(0.5)


def run(args) -> int:
    run = Run(args, args.budget)
    vocab = _vocab(args.model)
    rng = random.Random(0)
    ids = lambda n: [rng.randrange(3, vocab) for _ in range(n)]   # noqa: E731
    contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    docs = {n: ids(n) for n in contexts}
    questions = [ids(args.question_tokens) for _ in range(args.questions + 2)]
    serve = ["--device", args.device, "--weights", "keep", *args.serve_args]
    cache = Path(args.cache_dir)
    shutil.rmtree(cache, ignore_errors=True)          # cold means nothing cached
    daemon = ManagedDaemon(args.model, cache, Path(args.log), serve,
                           ready_timeout=max(run.left(), 1))
    peaks = Peaks(args.device.startswith("cuda"))
    run.result["peaks"] = peaks.peaks

    def cut(*_) -> None:
        """A time limit's SIGTERM: the daemon killed, what was measured saved, out at
        once (threads blocked in a long request are not waited for)."""
        daemon.kill()
        run.result["cut"] = f"SIGTERM after {time.monotonic() - run.t0:.0f} s"
        run.save()
        os._exit(143)
    signal.signal(signal.SIGTERM, cut)

    def start() -> dict:
        daemon.ready_timeout = max(run.left(), 1)
        t0 = time.monotonic()
        try:
            daemon.start()
        finally:
            peaks.pid = daemon.proc.pid if daemon.proc else None
            if args.pid_file and peaks.pid:
                Path(args.pid_file).write_text(f"{peaks.pid}\n")
        return {"load_s": round(time.monotonic() - t0, 1)}

    def ask(prompt: list[int], tokens: int, reserve: float = 0.0) -> dict:
        daemon.client.timeout = max(run.left() - reserve, 1)
        return _row(daemon.client.complete(prompt, tokens, ignore_eos=True))

    try:
        peaks.mark("start")
        loaded = run.phase("start", start)
        if loaded is None:
            return 1
        load_s = loaded["load_s"]
        peaks.mark("warm-up")
        # the first request's TTFT is mostly Triton's compiling: the row shows it
        run.phase("warm-up", lambda: {
            **ask(ids(args.warmup), 8),
            "batch": _together(daemon.client, [ids(64) for _ in range(args.batch)], 8)})
        peaks.mark("decode")
        run.phase("decode batch 1", lambda: ask(ids(128), args.decode))
        run.phase(f"decode batch {args.batch}", lambda: _together(
            daemon.client, [ids(128) for _ in range(args.batch)], args.decode))
        main, rest = contexts[0], contexts[1:]
        doc = docs[main]
        keep = KEEP_FOR_RESTART + 1.5 * load_s     # the restart's share, kept from the cold
        peaks.mark(f"{main} cold")
        cold = run.phase(f"{main} cold", lambda: ask(doc + questions[0], args.answer, keep),
                         need=keep + 10)
        peaks.mark(f"{main} questions")
        for i in range(1, args.questions + 1):
            if cold is None:
                break
            run.phase(f"{main} question {i}",
                      lambda i=i: ask(doc + questions[i], args.answer, keep))
        peaks.mark("restart")
        if cold is not None:
            run.phase("drain the writer", lambda: _drain(daemon.client,
                                                       min(90.0, run.left() - keep)))
        daemon.kill()
        restarted = run.phase("restart (SIGKILL, start)", start, need=load_s + 10)
        if restarted is not None and cold is not None:
            run.phase(f"{main} question 1 after restart",
                      lambda: ask(doc + questions[1], args.answer))
            run.phase(f"{main} new question after restart",
                      lambda: ask(doc + questions[-1], args.answer))
        for n in rest if restarted is not None else ():
            peaks.mark(f"{n} context")
            if run.phase(f"{n} cold", lambda n=n: ask(docs[n] + questions[0], args.answer),
                         need=10) is not None:
                run.phase(f"{n} question", lambda n=n: ask(docs[n] + questions[1],
                                                           args.answer))
    finally:
        peaks.mark("stop")
        code = daemon.stop()
        peaks.stop()
        run.result["exit_code"] = code
        run.result["took_s"] = round(time.monotonic() - run.t0, 1)
        run.save()
    return 0 if all(p["status"] == "ok" for p in run.result["phases"]) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptd.tools.bench.full_size",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the .gguf (tools/bench/big_gguf.py)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget", type=float, default=400, help="seconds for every phase")
    p.add_argument("--contexts", default="250000,32768,131072",
                   help="context tokens: the first gets the questions and the restart")
    p.add_argument("--questions", type=int, default=3)
    p.add_argument("--question-tokens", type=int, default=24)
    p.add_argument("--answer", type=int, default=32, help="tokens generated per question")
    p.add_argument("--decode", type=int, default=128, help="tokens of the decode phases")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=512, help="prompt tokens of the warm-up")
    p.add_argument("--serve-arg", action="append", default=[], dest="serve_arg",
                   help="extra `ckptd serve` arguments (repeatable; split like a shell)")
    p.add_argument("--cache-dir", default="/tmp/ckptd-full-size-cache")
    p.add_argument("--json", help="write the results here (after every phase)")
    p.add_argument("--log", default="full_size-daemon.log")
    p.add_argument("--pid-file", help="the daemon's pid is written here at each start "
                   "(for a caller that must make sure it is gone)")
    args = p.parse_args(argv)
    args.serve_args = [a for arg in args.serve_arg for a in shlex.split(arg)]
    for name in ("budget", "questions", "question_tokens", "answer", "decode", "batch",
                 "warmup"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if not Path(args.model).is_file():
        p.error(f"--model: no file {args.model}")
    try:
        if min(int(c) for c in args.contexts.split(",")) < 1:
            raise ValueError
    except ValueError:
        p.error(f"--contexts: comma-separated positive token counts, got {args.contexts!r}")
    return run(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

"""Load a running daemon with many clients and check what it answers.

    python -m ckptd.tools.bench.load_test --url http://127.0.0.1:8080 --clients 32 --seconds 60

Each client loops until the time is up: a prompt that starts with one of a few
shared documents (a cache hit once it has been seen) or a fresh one (a miss),
streamed or not, through /v1/completions, /v1/chat/completions or /completion,
and now and then dropped early (a cancelled request). Greedy answers served
from the cache are spot-checked against the same prompt sent with the cache
off: the tokens must be the same. With --pid, the daemon's resident memory is
sampled from /proc. Prints a summary; --json writes every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field

import aiohttp

from ckptd.tools.bench.load_work import Job, Outcome, make_job, run_job

WORDS = ("cache state prefix token layer model memory answer question river mountain "
         "city ocean winter summer number letter garden window system daemon restore "
         "checkpoint block snapshot tier disk host device stream batch queue").split()


@dataclass
class Totals:
    requests: int = 0
    ok: int = 0
    cancelled: int = 0
    refused: int = 0                  # 503 queue_full: the queue was full
    server_errors: int = 0            # any other 5xx
    client_errors: int = 0            # a 4xx to a well-formed request
    transport_errors: int = 0         # reset, timeout (a hang), malformed answer
    checked: int = 0                  # cached answers compared with an uncached run
    wrong: int = 0
    cache_hits: int = 0
    statuses: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)   # the first few, for the report
    ttft_s: list = field(default_factory=list)
    latency_s: list = field(default_factory=list)

    def add(self, o: Outcome) -> None:
        self.requests += 1
        key = f"{o.status} {o.code}" if o.code else str(o.status)
        self.statuses[key] = self.statuses.get(key, 0) + 1
        if o.cancelled:
            self.cancelled += 1
        elif o.status == 200 and o.error is None:
            self.ok += 1
            self.latency_s.append(o.latency_s)
            if o.ttft_s is not None:
                self.ttft_s.append(o.ttft_s)
            self.cache_hits += int(o.cached_tokens > 0)
        elif o.status == 503 and o.code == "queue_full":
            self.refused += 1
        elif o.status >= 500:
            self.server_errors += 1
        elif o.status >= 400:
            self.client_errors += 1
        else:
            self.transport_errors += 1
        if o.error is not None and not o.cancelled and o.code != "queue_full" \
                and len(self.problems) < 20:
            self.problems.append(f"{o.endpoint}: {o.status} {o.error}")

    @property
    def errors(self) -> int:
        return self.server_errors + self.client_errors + self.transport_errors + self.wrong


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Checker:
    """Uncached greedy references, one per prompt, computed once and shared."""

    def __init__(self) -> None:
        self.refs: dict[str, asyncio.Future] = {}

    async def reference(self, session: aiohttp.ClientSession, url: str, job: Job,
                        timeout: float) -> Outcome:
        key = job.ref_key()
        if key not in self.refs:
            self.refs[key] = asyncio.ensure_future(
                run_job(session, url, job.uncached(), timeout))
        return await asyncio.shield(self.refs[key])


async def client(i: int, args, session: aiohttp.ClientSession, totals: Totals,
                 checker: Checker, docs: list[str], stop_at: float) -> None:
    rng = random.Random(args.seed * 1000 + i)
    n = 0
    while time.monotonic() < stop_at:
        n += 1
        job = make_job(rng, docs, WORDS, args, f"c{i}r{n}")
        out = await run_job(session, args.url, job, args.timeout)
        totals.add(out)
        if out.status == 503:                        # queue full: honour Retry-After
            await asyncio.sleep(min(out.retry_after or 1.0, 1.0) * rng.random())
        if out.ok and out.cached_tokens > 0 and rng.random() < args.check:
            ref = await checker.reference(session, args.url, job, args.timeout)
            if ref.ok:
                totals.checked += 1
                if ref.answer != out.answer:
                    totals.wrong += 1
                    totals.problems.append(
                        f"wrong output {job.endpoint} ({out.cached_tokens} cached): "
                        f"{out.answer!r:.80} != uncached {ref.answer!r:.80}")


async def sample_rss(pid: int, samples: list[tuple[float, int]], t0: float) -> None:
    while True:
        kib = rss_kib(pid)
        if kib is not None:
            samples.append((time.monotonic() - t0, kib))
        await asyncio.sleep(0.5)


async def run(args) -> dict:
    rng = random.Random(args.seed)
    docs = [" ".join(rng.choice(WORDS) for _ in range(args.doc_words))
            for _ in range(args.docs)]
    totals, checker, samples = Totals(), Checker(), []
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=conn, headers=headers) as session:
        sampler = asyncio.ensure_future(sample_rss(args.pid, samples, t0)) if args.pid else None
        stop_at = t0 + args.seconds
        await asyncio.gather(*(client(i, args, session, totals, checker, docs, stop_at)
                               for i in range(args.clients)))
        if sampler is not None:
            sampler.cancel()
    wall = time.monotonic() - t0
    return summary(args, totals, samples, wall)


def summary(args, t: Totals, samples: list[tuple[float, int]], wall: float) -> dict:
    out = {k: v for k, v in asdict(t).items() if k not in ("ttft_s", "latency_s")}
    out.update(clients=args.clients, seconds=args.seconds, wall_s=round(wall, 2),
               errors=t.errors, requests_per_s=round(t.requests / wall, 2) if wall else None,
               ttft_p50_ms=_ms(pct(t.ttft_s, 0.5)), ttft_p99_ms=_ms(pct(t.ttft_s, 0.99)),
               latency_p50_ms=_ms(pct(t.latency_s, 0.5)),
               latency_p99_ms=_ms(pct(t.latency_s, 0.99)), streams_timed=len(t.ttft_s))
    warm_at = args.seconds * args.warmup
    warm = [kib for ts, kib in samples if ts >= warm_at]
    if warm:
        out.update(rss_warm_kib=warm[0], rss_end_kib=warm[-1], rss_max_kib=max(warm),
                   rss_growth=round((warm[-1] - warm[0]) / warm[0], 4))
    return out


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1000, 1)


def report(s: dict) -> str:
    lines = [
        f"load: {s['clients']} clients x {s['seconds']} s (wall {s['wall_s']} s)",
        f"requests: {s['requests']} done ({s['requests_per_s']}/s): {s['ok']} ok, "
        f"{s['cancelled']} cancelled, {s['refused']} refused (queue full), "
        f"{s['cache_hits']} cache hits",
        f"errors: {s['errors']} (5xx {s['server_errors']}, 4xx {s['client_errors']}, "
        f"transport {s['transport_errors']}, wrong outputs {s['wrong']} of "
        f"{s['checked']} checked)",
        f"TTFT (streams, n={s['streams_timed']}): p50 {s['ttft_p50_ms']} ms, "
        f"p99 {s['ttft_p99_ms']} ms; latency p50 {s['latency_p50_ms']} ms, "
        f"p99 {s['latency_p99_ms']} ms",
    ]
    if "rss_growth" in s:
        lines.append(f"daemon RSS after warm-up: {s['rss_warm_kib'] // 1024} MiB -> "
                     f"{s['rss_end_kib'] // 1024} MiB ({100 * s['rss_growth']:+.1f}%), "
                     f"max {s['rss_max_kib'] // 1024} MiB")
    lines += [f"  problem: {p}" for p in s["problems"][:10]]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ckptd.tools.bench.load_test",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the daemon, e.g. http://127.0.0.1:8080")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=8, help="tokens per answer")
    p.add_argument("--docs", type=int, default=6, help="shared documents (cache hits)")
    p.add_argument("--doc-words", type=int, default=50)
    p.add_argument("--cached", type=float, default=0.6, help="share of prompts on a document")
    p.add_argument("--stream", type=float, default=0.5, help="share of streamed requests")
    p.add_argument("--cancel", type=float, default=0.1, help="share dropped early")
    p.add_argument("--check", type=float, default=0.3,
                   help="share of cache hits compared with an uncached run")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--pid", type=int, default=None, help="daemon pid: sample its RSS")
    p.add_argument("--warmup", type=float, default=0.3,
                   help="share of the run before RSS counts as warm")
    p.add_argument("--api-key", default=None)
    p.add_argument("--json", default=None, help="write the figures to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.clients < 1 or args.seconds <= 0:
        print("load_test: --clients and --seconds must be positive", file=sys.stderr)
        return 2
    s = asyncio.run(run(args))
    print(report(s))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(s, fh, indent=1)
    return 0 if s["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Concurrent clients on one shared prefix: requests/s and TTFT percentiles.

    python -m ckptd.tools.bench.concurrency --url http://127.0.0.1:8080 [--peer URL]
        [--prefix-tokens 8192] [--clients 1,4,16] [--requests 2] [--max-tokens 8]

Every client sends `--requests` requests, one after another, each the shared
prefix plus a question of its own, streamed and greedy. The prefix is sent once
first (not measured), so both servers start from a warm prefix: what is measured
is how each serves many clients that share it. Prints a Markdown table and
writes it with the raw figures to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ckptd.tools.bench.client import Client, Measured
from ckptd.tools.bench.scenarios import PromptMaker, filler, opening


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the two nearest ranks."""
    if not values:
        raise ValueError("no values")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def one_level(client: Client, prefix: str, clients: int, requests: int, max_tokens: int,
              tag: str) -> dict:
    def worker(c: int) -> list[Measured]:
        out = []
        for r in range(requests):
            question = f"\nQuestion {tag}-{c}-{r}: {filler(12, 97 * c + r)}\nAnswer:"
            out.append(client.complete(prefix + question, max_tokens))
        return out

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [m for got in pool.map(worker, range(clients)) for m in got]
    wall = time.perf_counter() - t0
    ttft = [m.ttft_ms for m in results]
    cached = [m.cache_n for m in results if m.cache_n is not None]
    return {"clients": clients, "requests": len(results), "seconds": round(wall, 2),
            "requests_per_s": round(len(results) / wall, 3),
            "ttft_p50_ms": round(percentile(ttft, 50), 1),
            "ttft_p99_ms": round(percentile(ttft, 99), 1),
            "mean_cached_tokens": round(statistics.mean(cached), 1) if cached else None,
            "mean_prompt_tokens": round(statistics.mean(
                [m.prompt_n for m in results if m.prompt_n is not None] or [0]), 1)}


def run_server(client: Client, maker: PromptMaker, args, levels: list[int]) -> list[dict]:
    tag = uuid.uuid4().hex[:8]
    prefix = maker.text(f"{tag}-shared", args.prefix_tokens, seed=11)
    client.complete(f"{opening(tag)} warm-up. " + filler(20, 0), 2)
    client.complete(prefix, 1)                      # the prefix, once, not measured
    return [one_level(client, prefix, n, args.requests, args.max_tokens, tag) for n in levels]


def markdown(rows: list[dict]) -> str:
    head = ("| server | clients | requests | req/s | TTFT p50 ms | TTFT p99 ms | "
            "mean cached / prompt tokens |\n|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['server']} | {r['clients']} | {r['requests']} | {r['requests_per_s']} | "
        f"{r['ttft_p50_ms']} | {r['ttft_p99_ms']} | {r['mean_cached_tokens']} / "
        f"{r['mean_prompt_tokens']} |\n" for r in rows)
    return head + body


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptd.tools.bench.concurrency",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the ckptd daemon")
    p.add_argument("--peer", help="another OpenAI-compatible server (llama.cpp)")
    p.add_argument("--peer-name", default="llama.cpp")
    p.add_argument("--prefix-tokens", type=int, default=8192)
    p.add_argument("--clients", default="1,4,16", help="comma-separated client counts")
    p.add_argument("--requests", type=int, default=2, help="requests per client")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", default="bench-out/concurrency")
    args = p.parse_args(argv)
    try:
        levels = [int(v) for v in args.clients.split(",") if v.strip()]
    except ValueError:
        p.error(f"--clients: expected comma-separated integers, got {args.clients!r}")
    if not levels or min(levels) < 1 or args.requests < 1 or args.prefix_tokens < 1:
        p.error("--clients, --requests and --prefix-tokens must be positive")
    servers = [("ckptd", Client(args.url, timeout=args.timeout))]
    if args.peer:
        servers.append((args.peer_name, Client(args.peer, timeout=args.timeout,
                                               extra={"cache_prompt": True})))
    maker = PromptMaker(servers[0][1])      # every server gets the very same texts
    rows = []
    for name, client in servers:
        client.wait_ready(60.0)
        for r in run_server(client, maker, args, levels):
            rows.append({"server": name, **r})
            print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "CPUs": os.cpu_count(),
            "load average": " ".join(f"{v:.2f}" for v in os.getloadavg()),
            "argv": sys.argv[1:]}
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    table = markdown(rows)
    (out / "report.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

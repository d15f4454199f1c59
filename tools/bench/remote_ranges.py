"""The remote tier's transfer alone: segment-sized objects read the way a restore reads
them (ranged GETs of range_bytes, `concurrency` in flight, through the daemon's own
client), against the same bytes as one object read with one plain GET. No decoding:
what a restore's bytes cost on the wire, apart from what turning them into pages costs.

    python -m ckptd.tools.bench.remote_ranges [--mb 58] [--segment-mib 8] [--repeat 3]
        [--concurrency 8] [--range-mib 4] [--latency 0.01] [--url s3://BUCKET/PREFIX]

Starts SeaweedFS on loopback unless --url names another store (the AWS_* variables).
Each case runs directly and through tools/bench/slow_proxy.py adding --latency seconds
each way to every request (0.01: 20 ms a request).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid

from ckptd.cache.remote.client import RemoteClient, RemoteConfig
from ckptd.cache.remote.layout import RemoteURL
from ckptd.cache.remote.ranges import Loc, plan_ranges
from ckptd.tools.bench.seaweed import local_unless
from ckptd.tools.bench.slow_proxy import SlowProxy

MB = 1e6


def _ranged(client: RemoteClient, names: list[str], size: int) -> float:
    """Seconds to read every object whole in the restore's ranged GETs."""
    chunks = plan_ranges([Loc(n, 0, size, size) for n in names], client.config.range_bytes)
    t0 = time.perf_counter()
    got = [f.result() for f in [client.pool.submit(client.get_range, c.name, c.start, c.end)
                                for c in chunks]]
    seconds = time.perf_counter() - t0
    assert sum(len(g[0]) for g in got) == size * len(names)
    return seconds


def _plain(client: RemoteClient, name: str) -> float:
    t0 = time.perf_counter()
    body = client.s3.get_object(Bucket=client.url.bucket, Key=name)["Body"].read()
    seconds = time.perf_counter() - t0
    assert body
    return seconds


def measure(url: str, mb: float, segment: int, repeat: int, concurrency: int,
            range_bytes: int) -> dict:
    client = RemoteClient(RemoteConfig(RemoteURL.parse(url), concurrency=concurrency,
                                       range_bytes=range_bytes))
    root = f"{client.url.prefix}/bench-ranges-{uuid.uuid4().hex[:8]}".lstrip("/")
    n = max(1, round(mb * MB / segment))
    names = [f"{root}/seg-{i}" for i in range(n)]
    for name in names:
        client.put(name, os.urandom(segment))
    whole = f"{root}/whole"
    client.put(whole, os.urandom(segment * n))
    try:
        before = client.requests["get"]
        ranged = [_ranged(client, names, segment) for _ in range(repeat)]
        gets = (client.requests["get"] - before) // repeat
        plain = [_plain(client, whole) for _ in range(repeat)]
    finally:
        client.delete([*names, whole])
        client.pool.shutdown()
    r, p = statistics.median(ranged), statistics.median(plain)
    nbytes = segment * n
    return {"bytes": nbytes, "objects": n, "gets": gets, "ranged_s": round(r, 3),
            "plain_s": round(p, 3), "ranged_mb_s": round(nbytes / MB / r, 1),
            "plain_mb_s": round(nbytes / MB / p, 1), "share": round(p / r, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptd.tools.bench.remote_ranges")
    p.add_argument("--mb", type=float, default=58.0, help="bytes read, in MB")
    p.add_argument("--segment-mib", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=RemoteConfig.concurrency)
    p.add_argument("--range-mib", type=int, default=RemoteConfig.range_bytes >> 20)
    p.add_argument("--latency", type=float, default=0.01)
    p.add_argument("--url", help="s3://BUCKET/PREFIX (default: start SeaweedFS here)")
    args = p.parse_args(argv)
    if args.mb <= 0 or min(args.segment_mib, args.range_mib, args.repeat) < 1:
        raise SystemExit("--mb, --segment-mib, --range-mib and --repeat must be positive")
    with local_unless(args.url, "bench-ranges") as url:
        rows = {"loopback": measure(url, args.mb, args.segment_mib << 20, args.repeat,
                                    args.concurrency, args.range_mib << 20)}
        port = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1].split("/")[0])
        proxy = SlowProxy(port, latency=args.latency).start()
        direct = os.environ["AWS_ENDPOINT_URL"]
        os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
        try:
            rows[f"+{2 * args.latency * 1000:.0f} ms a request"] = measure(
                url, args.mb, args.segment_mib << 20, args.repeat, args.concurrency,
                args.range_mib << 20)
        finally:
            os.environ["AWS_ENDPOINT_URL"] = direct
            proxy.stop()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "?")
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {cpu}, load {os.getloadavg()[0]:.1f}, "
          f"{args.concurrency} in flight, ranges of {args.range_mib} MiB, median of {args.repeat}")
    print("| path | bytes | ranged GETs | ranged | one plain GET | ranged / plain |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['bytes'] / MB:.1f} MB in {r['objects']} objects | {r['gets']} | "
              f"{r['ranged_s']:.2f} s ({r['ranged_mb_s']:.0f} MB/s) | {r['plain_s']:.2f} s "
              f"({r['plain_mb_s']:.0f} MB/s) | {r['share']:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

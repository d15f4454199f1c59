"""The remote tier over HTTP: a context prefilled by one daemon, restored by another.

    python -m ckptd.tools.bench.remote [--models tiny-hybrid,smollm2] [--lengths 32768]
        [--out DIR] [--slow-rate 250000] [--slow-delay 0.02] [--slow-seconds 60]

Starts SeaweedFS (tools/bench/seaweed.py) on loopback unless AWS_ENDPOINT_URL and
--url s3://... name another store. For each model and context length L, with daemons
that each have an empty cache folder and one bucket prefix:

    cold     daemon A computes the context (its time to the first token; every
             daemon answers a short prompt first, so first-request costs stay out)
    upload   A's write-behind until everything is on the remote: seconds, objects
             and bytes put per context (and per token)
    remote   daemon B, empty folder, restores it from the remote
    lmdb     B restarted (RAM empty): the same from its own LMDB, where the remote
             read put it

and then, through a proxy that slows the remote (tools/bench/slow_proxy.py: --slow-rate
bytes/s per connection, --slow-delay s per chunk each way), daemon C computes the
same context under a fresh prefix: its upload queue sampled every half second for
--slow-seconds, and a short prompt's time answered meanwhile against its time before.
Writes results.json and report.md into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import threading
import time
import uuid
from pathlib import Path

from ckptd.tools.bench.managed import ManagedDaemon
from ckptd.tools.bench.seaweed import BUCKET, SeaweedS3
from ckptd.tools.bench.slow_proxy import SlowProxy
from ckptd.tools.make_tiny import make_tiny

VOCAB = {"tiny-hybrid": 512, "smollm2": 49152}


def _complete(client, prompt: list[int], n: int = 1) -> dict:
    t0 = time.perf_counter()
    status, out = client.request("POST", "/completion", {
        "prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True,
        "return_tokens": True})
    if status != 200:
        raise RuntimeError(f"/completion answered {status}: {out}")
    t = out["timings"]
    return {"ms": round((time.perf_counter() - t0) * 1000, 1), "tokens": out["tokens"],
            "cached": t["cache_n"], "tier": t.get("cache_tier"), "restore_ms": t["restore_ms"]}


def _short(tokens: list[int], i: int) -> list[int]:
    """A short prompt nothing cached starts like (it leads with its own token)."""
    return [3 + i % 200, *tokens]


def _stats(client) -> dict:
    status, out = client.request("GET", "/cache/stats")
    if status != 200:
        raise RuntimeError(f"/cache/stats answered {status}")
    return out


def _drain(client, timeout: float = 1800) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        s = _stats(client)
        if not s["write_queue"]["depth"] and not s["remote"]["uploads"]["depth"]:
            return time.perf_counter() - t0
        time.sleep(0.1)
    raise TimeoutError("uploads did not drain")


def one(model: str, path: str | None, length: int, url: str, out: Path, args) -> dict:
    rng = random.Random(length)
    prompt = [rng.randrange(3, VOCAB[model]) for _ in range(length)]
    short = [rng.randrange(3, VOCAB[model]) for _ in range(64)]
    serve = ["--max-context", str(length + 128), "--parallel", "1", "--remote", url,
             "--step-tokens", "512", *args.serve_arg]
    tag = f"{model}-{length}"
    row: dict = {"model": model, "length": length}
    with ManagedDaemon(path, out / f"{tag}-a", out / f"{tag}-a.log", serve) as a:
        a.start()
        _complete(a.client, _short(short, 150))      # first-request costs out of the way
        row["cold"] = _complete(a.client, prompt)
        row["upload_drain_s"] = round(_drain(a.client), 2)
        up = _stats(a.client)["remote"]
        row["uploaded"] = {"objects": up["uploads"]["uploaded"],
                           "bytes": up["uploads"]["uploaded_bytes"],
                           "bytes_per_token": round(up["uploads"]["uploaded_bytes"] / length),
                           "puts": up["requests"]["put"]}
    with ManagedDaemon(path, out / f"{tag}-b", out / f"{tag}-b.log", serve) as b:
        b.start()
        _complete(b.client, _short(short, 151))
        row["remote"] = _complete(b.client, prompt)
        row["remote_fetch"] = _stats(b.client)["remote"]["fetch"]
        _drain(b.client)
        b.restart()
        _complete(b.client, _short(short, 152))
        row["lmdb"] = _complete(b.client, prompt)
    same = row["remote"]["tokens"] == row["cold"]["tokens"] == row["lmdb"]["tokens"]
    row["same_tokens"] = same
    row["slow"] = slow(path, prompt, short, url + "-slow", serve, out / tag, args)
    return row


def slow(path, prompt, short, url: str, serve: list[str], out: Path, args) -> dict:
    """The upload queue of a daemon whose remote is slow, and its short prompts' times:
    before (warm, nothing to upload), while uploads run, and with the remote hung."""
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    port = int(endpoint.rsplit(":", 1)[1].split("/")[0])
    proxy = SlowProxy(port, delay=args.slow_delay, rate=args.slow_rate).start()
    i = serve.index("--remote")
    serve = [*serve[:i], "--remote", url, *serve[i + 2:]]
    samples: list[dict] = []
    times: dict[str, list[float]] = {"before": [], "during": [], "hung": []}
    try:
        with ManagedDaemon(path, Path(f"{out}-c"), Path(f"{out}-c.log"), serve,
                           env={"AWS_ENDPOINT_URL": proxy.endpoint}) as c:
            c.start()
            n = 0
            for k in range(5):                        # two to warm up, three measured
                ms = _complete(c.client, _short(short, n))["ms"]
                n += 1
                if k >= 2:
                    times["before"].append(ms)
            _drain(c.client)
            cold: dict = {}
            t0 = time.perf_counter()
            job = threading.Thread(target=lambda: cold.update(_complete(c.client, prompt)))
            job.start()
            prefill_end, next_short = None, 0.0
            while True:
                now = time.perf_counter() - t0
                up = _stats(c.client)["remote"]["uploads"]
                samples.append({"t": round(now, 1), **{k: up[k] for k in (
                    "depth", "bytes", "uploaded", "uploaded_bytes", "dropped", "evicted")}})
                if prefill_end is None and not job.is_alive():
                    prefill_end = now
                if prefill_end is not None:
                    if not up["depth"] or now - prefill_end > args.slow_seconds:
                        break
                    if now >= next_short:
                        times["during"].append(_complete(c.client, _short(short, n))["ms"])
                        n, next_short = n + 1, now + 2.0
                time.sleep(0.5)
            job.join()
            proxy.stall = True                        # hung: uploads wait, serving goes on
            for _ in range(3):
                times["hung"].append(_complete(c.client, _short(short, n))["ms"])
                n += 1
            final = _stats(c.client)["remote"]["uploads"]
            proxy.stall = False
    finally:
        proxy.stop()
    rate = [s for s in samples if prefill_end is None or s["t"] >= prefill_end]
    mbps = ((rate[-1]["uploaded_bytes"] - rate[0]["uploaded_bytes"]) /
            max(rate[-1]["t"] - rate[0]["t"], 1e-9) / 1e6) if len(rate) > 1 else None
    return {"rate_per_connection": args.slow_rate, "delay_s": args.slow_delay,
            "cold_ms": cold.get("ms"), "prefill_end_s": prefill_end,
            "peak_depth": max((s["depth"] for s in samples), default=0),
            "peak_backlog_bytes": max((s["bytes"] for s in samples), default=0),
            "bound_entries": final["bound_entries"], "dropped": final["dropped"],
            "evicted": final["evicted"], "uploaded": final["uploaded"],
            "uploaded_bytes": final["uploaded_bytes"], "depth_at_end": final["depth"],
            "upload_mb_per_s": None if mbps is None else round(mbps, 2),
            "short_ms": {k: [round(v) for v in vs] for k, vs in times.items()},
            "samples": samples}


def report(rows: list[dict], meta: dict) -> str:
    lines = [f"Remote tier benchmark, {meta['date']}, load {meta['load']}", "",
             "| model | context | cold | from remote | from LMDB | cached (remote) | "
             "uploaded | bytes/token | upload drain |", "|---|---:|---:|---:|---:|---:|---:|"
             "---:|---:|"]
    for r in rows:
        u = r["uploaded"]
        lines.append(f"| {r['model']} | {r['length']} | {r['cold']['ms']:.0f} ms | "
                     f"{r['remote']['ms']:.0f} ms | {r['lmdb']['ms']:.0f} ms | "
                     f"{r['remote']['cached']} ({r['remote']['tier']}) | "
                     f"{u['bytes'] / 1e6:.1f} MB in {u['objects']} objects | "
                     f"{u['bytes_per_token']} | {r['upload_drain_s']} s |")
    lines += ["", "Slow remote (upload queue):", ""]
    for r in rows:
        s = r["slow"]
        lines.append(f"- {r['model']} {r['length']}: {s['rate_per_connection']:.0f} B/s a "
                     f"connection, {s['delay_s']} s a chunk; cold {s['cold_ms']:.0f} ms; peak "
                     f"queue {s['peak_depth']} entries ({s['peak_backlog_bytes'] / 1e6:.1f} MB "
                     f"waiting in LMDB), bound {s['bound_entries']}; {s['uploaded']} uploaded "
                     f"({s['uploaded_bytes'] / 1e6:.1f} MB, {s['upload_mb_per_s']} MB/s after "
                     f"the prefill), {s['dropped']} dropped, {s['evicted']} evicted first, "
                     f"{s['depth_at_end']} left; short prompts (ms) {s['short_ms']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptd.tools.bench.remote")
    p.add_argument("--models", default="tiny-hybrid")
    p.add_argument("--lengths", default="32768")
    p.add_argument("--out", default="bench-remote")
    p.add_argument("--url", help="s3://BUCKET/PREFIX of an S3 store named by the AWS_* "
                                 "variables (default: start SeaweedFS here)")
    p.add_argument("--slow-rate", type=float, default=250_000.0)
    p.add_argument("--slow-delay", type=float, default=0.02)
    p.add_argument("--slow-seconds", type=float, default=60.0)
    p.add_argument("--serve-arg", action="append", default=[])
    args = p.parse_args(argv)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "load": os.getloadavg()[0]}   # at start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = out / time.strftime("run-%Y%m%d-%H%M%S")    # cache folders and logs: fresh
    run.mkdir()
    server = None
    if args.url is None:
        server = SeaweedS3(Path(tempfile.mkdtemp(prefix="bench-s3-"))).start().wait_ready()
        os.environ.update(server.env())
        args.url = f"s3://{BUCKET}/bench-{uuid.uuid4().hex[:8]}"
    rows = []
    try:
        for model in args.models.split(","):
            path = None
            if model == "tiny-hybrid":

                path = str(make_tiny("qwen3_5_text", Path(tempfile.mkdtemp(prefix="tiny-"))))
            for length in (int(v) for v in args.lengths.split(",")):
                rows.append(one(model, path, length, f"{args.url}/{model}-{length}", run, args))
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "slow"}))
    finally:
        if server is not None:
            server.kill()
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / "report.md").write_text(report(rows, meta))
    print(report(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

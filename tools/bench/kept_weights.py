"""Kept vs expanded GGUF weights vs llama-server on one file: prefill and decode tokens/s
and each server's RSS, in one run.

    python -m ckptd.tools.bench.kept_weights [--model M.gguf] [--prompt-tokens 512]
        [--decode 64] [--repeat 2] [--peer .peer-server/llama-server] [--threads 2]
        [--modes keep,expand]

Each server is started alone (ckptd serve --weights keep, then expand, then the peer),
sent the same prompt (a fresh one per repeat, so no prompt cache serves it) on
/completion with greedy sampling, and its `timings` read; the best of --repeat runs
is kept. RSS is the server process's VmRSS after its last request. CPU-seconds per
decoded token, which a shared machine's load distorts less than the wall time: the
server's CPU time (its process tree's, from /proc) over a request of --decode tokens
less that over a request of one token, after the same short prompt, divided by
--decode - 1 (the least of three tries); the 1-minute load is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ckptd.model.default import default_model_path
from ckptd.tools.bench.managed import free_port

ROOT = Path(__file__).resolve().parents[2]


def _post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.loads(r.read())


def _wait(port: int, proc: subprocess.Popen, timeout: float = 600) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError("server did not become ready")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s(pid: int) -> float:
    """User + system CPU-seconds of pid and its descendants (alive ones)."""
    total, todo = 0.0, [pid]
    tick = os.sysconf("SC_CLK_TCK")
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return total


def _prompt(tag: str, tokens: int) -> str:
    return " ".join(f"{tag}x{i}" for i in range(tokens // 3))


def _cpu_per_token(port: int, pid: int, args) -> float:
    """CPU-seconds a decoded token costs the server (see the module's docstring): the
    least of three tries, each after a short prompt (whose prefill's CPU time varies
    with the load, more so with a server's spinning threads, and would drown the
    difference)."""
    best = float("inf")
    for r in range(3):
        spent = []
        for n in (1, args.decode):
            c0 = _cpu_s(pid)
            _post(port, {"prompt": _prompt(f"c{r}n{n}", 30), "n_predict": n,
                         "temperature": 0, "cache_prompt": False, "ignore_eos": True})
            spent.append(_cpu_s(pid) - c0)
        best = min(best, (spent[1] - spent[0]) / max(1, args.decode - 1))
    return best


def measure(name: str, cmd: list[str], port: int, args) -> dict:
    log = open(Path(args.out) / f"{name}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(port, proc)
        best = {"prefill_tps": 0.0, "decode_tps": 0.0}
        for r in range(args.repeat + 1):       # the first run warms up
            words = _prompt(f"w{r}", args.prompt_tokens)
            out = _post(port, {"prompt": words, "n_predict": args.decode, "temperature": 0,
                               "cache_prompt": False, "ignore_eos": True})
            t = out["timings"]
            if r:
                best["prefill_tps"] = max(best["prefill_tps"], t["prompt_per_second"])
                best["decode_tps"] = max(best["decode_tps"], t["predicted_per_second"])
                best["prompt_n"] = t["prompt_n"]
                best["predicted_n"] = t["predicted_n"]
        best["cpu_s_per_token"] = round(_cpu_per_token(port, proc.pid, args), 4)
        best["load_1min"] = round(os.getloadavg()[0], 1)
        best["rss_mib"] = _rss_mib(proc.pid)
        return {"server": name, **best}
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def main(argv=None) -> int:

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(default_model_path()))
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--peer", default=str(ROOT / ".peer-server" / "llama-server"))
    p.add_argument("--out", default="bench-out")
    p.add_argument("--modes", default="keep,expand", help="ckptd's --weights modes to run; "
                   "keep:q8 or keep:fp32 also pass --gemv-activations")
    args = p.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rows = []
    for name in [m for m in args.modes.split(",") if m]:
        mode, _, gemv = name.partition(":")
        port = free_port()
        cmd = [sys.executable, "-m", "ckptd.tools.cli", "serve", "--model", args.model,
               "--port", str(port), "--weights", mode, "--threads", str(args.threads),
               "--cache-dir", str(Path(args.out) / f"cache-{mode}-{gemv}"), "--parallel", "1",
               "--kv-budget", "256MiB", "--host-budget", "64MiB"]
        cmd += ["--gemv-activations", gemv] if gemv else []
        rows.append(measure(f"ckptd-{name}", cmd, port, args))
        print(json.dumps(rows[-1]), flush=True)
    if Path(args.peer).exists():
        port = free_port()
        cmd = [args.peer, "--port", str(port), "--model", args.model, "--threads",
               str(args.threads), "--ctx-size", "4096", "--parallel", "1", "--cache-ram", "0"]
        rows.append(measure("llama-server", cmd, port, args))
        print(json.dumps(rows[-1]), flush=True)
    (Path(args.out) / "kept_weights.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The daemon end to end on one model: cold, warm, killed and restarted, with the
cache's answers checked against the uncached ones (greedy, so equal text).

    python -m ckptd.tools.bench.daemon_e2e --model M [--device cuda] [--context 2048]
        [--json OUT] [--log LOG]

Starts `ckptd serve` on a fresh cache folder and asks, over HTTP: a context of
--context tokens then a question, uncached (`cache: false`); the same, cold (fills the
cache); the same again (warm: served from the device pages / RAM); another question
after the context (a branch). Then SIGKILL, a restart on the same folder, and the
first question again (from disk). Every cached answer must equal the uncached one;
TTFT (the daemon's own timings) and cached tokens are reported. Exits 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from ckptd.tools.bench.store import english_text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Daemon:
    def __init__(self, model: str, cache: Path, log, extra: list[str]) -> None:
        self.port = _free_port()
        cmd = [sys.executable, "-m", "ckptd.tools.cli", "serve", "--model", model,
               "--port", str(self.port), "--cache-dir", str(cache), *extra]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5):
                    return
            except urllib.error.HTTPError:           # 503 while the model loads
                time.sleep(0.2)
            except OSError:
                time.sleep(0.2)
        raise TimeoutError("daemon not ready in 300 s")

    def ask(self, prompt: str, cache: bool, max_tokens: int) -> dict:
        body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True, "cache": cache}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.loads(r.read())
        return {"text": out["choices"][0]["text"],
                "cached": out["usage"]["prompt_tokens_details"]["cached_tokens"],
                "ttft_ms": out.get("timings", {}).get("prompt_ms"),
                "wall_ms": round((time.perf_counter() - t0) * 1e3, 1)}

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


def run(args) -> int:

    # a time limit's SIGTERM unwinds through the finally blocks: no daemon outlives us
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    context = english_text(4 * args.context)[:4 * args.context]   # ~--context tokens
    q1, q2 = "\nQuestion: what is this text about?\n", "\nQuestion: who wrote it?\n"
    extra = ["--device", args.device, "--dtype", args.dtype, *args.serve_arg]
    rows = {"model": Path(args.model).name, "device": args.device, "dtype": args.dtype,
            "context_chars": len(context)}
    for what in ("uncached", "cold", "warm", "branch", "after_sigkill"):
        rows[what] = None
    log = open(args.log, "ab") if args.log else subprocess.DEVNULL
    with tempfile.TemporaryDirectory(prefix="ckptd-e2e-") as tmp:
        d = _Daemon(args.model, Path(tmp) / "cache", log, extra)
        try:
            want1 = d.ask(context + q1, False, args.max_tokens)
            want2 = d.ask(context + q2, False, args.max_tokens)
            rows["uncached"] = want1
            rows["cold"] = d.ask(context + q1, True, args.max_tokens)
            rows["warm"] = d.ask(context + q1, True, args.max_tokens)
            rows["branch"] = d.ask(context + q2, True, args.max_tokens)
            time.sleep(args.write_wait)      # let the writer put the checkpoints on disk
        finally:
            d.kill()
        d = _Daemon(args.model, Path(tmp) / "cache", log, extra)
        try:
            rows["after_sigkill"] = d.ask(context + q1, True, args.max_tokens)
        finally:
            rows["exit_code"] = d.stop()
    same = [rows[k]["text"] == want1["text"] for k in ("cold", "warm", "after_sigkill")]
    same.append(rows["branch"]["text"] == want2["text"])
    rows["cached_equals_uncached"] = all(same)
    rows["ok"] = all(same) and rows["warm"]["cached"] > 0 and \
        rows["after_sigkill"]["cached"] > 0 and rows["exit_code"] == 0
    print(json.dumps(rows, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if rows["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="daemon_e2e", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--write-wait", type=float, default=3.0,
                   help="seconds before the SIGKILL (for the writer)")
    p.add_argument("--serve-arg", action="append", default=[])
    p.add_argument("--json")
    p.add_argument("--log")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

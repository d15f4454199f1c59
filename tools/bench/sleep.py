"""What sleeping (--sleep-idle-seconds) saves and costs on a real daemon: RSS awake and
asleep, the wake-up's model load, and the first answer after it (its prompt restored
from the cache tiers) against the same prompt computed cold.

    python -m ckptd.tools.bench.sleep [--model M] [--prompt-tokens 1000] [--rounds 3]

Each round: a fresh prompt computed cold (TTFT, RSS awake), wait for sleep (RSS
asleep), the same prompt again (wake-up load time from the daemon's log, TTFT with
the prompt restored, same text as the cold answer). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

from ckptd.tools.bench.managed import ManagedDaemon

_WOKE = re.compile(r"awake: model loaded again in ([0-9.]+) s")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc (Linux only)")


def _asleep(client, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, props = client.request("GET", "/props")
        if status == 200 and props["is_sleeping"]:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the daemon did not fall asleep in {timeout} s")


def _ask(client, prompt: list[int]) -> tuple[dict, float]:
    t0 = time.perf_counter()
    status, out = client.request("POST", "/completion", {"prompt": prompt, "n_predict": 1,
                                                          "temperature": 0.0})
    if status != 200:
        raise RuntimeError(f"/completion answered {status}: {out}")
    return out, (time.perf_counter() - t0) * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M")
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle", type=float, default=2.0, help="--sleep-idle-seconds")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = ManagedDaemon(a.model, Path(tmp) / "cache", Path(tmp) / "daemon.log",
                          ["--sleep-idle-seconds", str(a.idle), "--parallel", "1",
                           "--max-context", str(a.prompt_tokens + 64)])
        with d:
            client = d.start()
            for r in range(a.rounds):
                text = " ".join(f"Item {i} of round {r} is here." for i in range(a.prompt_tokens))
                words = client.tokenize(text)[:a.prompt_tokens]    # ids: exactly that many
                cold, cold_ms = _ask(client, words)
                awake = _rss_mib(d.proc.pid)
                _asleep(client)
                asleep = _rss_mib(d.proc.pid)
                warm, warm_ms = _ask(client, words)
                woke = _WOKE.findall(d.log_path.read_text(errors="replace"))
                if warm["content"] != cold["content"]:
                    raise RuntimeError("the answer after waking differs from the cold one")
                rows.append({"prompt_tokens": cold["tokens_evaluated"],
                             "rss_awake_mib": round(awake), "rss_asleep_mib": round(asleep),
                             "wake_load_s": float(woke[-1]) if woke else None,
                             "cold_request_ms": round(cold_ms),
                             "after_wake_request_ms": round(warm_ms),
                             "restored_tokens": warm["timings"]["cache_n"]})
    med = {k: statistics.median(x[k] for x in rows) for k in rows[0] if rows[0][k] is not None}
    print(json.dumps({"rounds": rows, "median": med}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The daemon's memory on a large GGUF with kept weights, against issue 21's bound:
peak RSS <= 1.3 x the file's size + --kv-budget + --host-budget.

    python -m ckptd.tools.bench.big_rss --model A3B.gguf [--kv-budget 512MiB]
        [--host-budget 512MiB] [--prompt-tokens 400] [--decode 32] [--threads 2]
        [--timeout 3600]

(make the file with `python -m ckptd.tools.bench.big_gguf`.) The daemon is started with
--weights keep and the budgets, sent a prompt (a few hundred tokens: with 8 of 256
experts a token, nearly every expert of every layer is read), decodes, then gets the
same prompt again (restored from the host tier). /proc/PID/status is sampled every
0.1 s: VmRSS, RssAnon (the process's own memory), RssFile (mapped file pages: the
kept weights), and VmHWM, the kernel's peak, which sampling cannot miss. Each phase's
maxima are reported, and the size `--weights expand` would need (every tensor in fp32).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import gguf

from ckptd.daemon.config import parse_size
from ckptd.tools.bench.client import Client
from ckptd.tools.bench.managed import ManagedDaemon

_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


def status(pid: int) -> dict[str, int]:
    """The memory lines of /proc/PID/status, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in _FIELDS:
            out[key] = int(rest.split()[0]) * 1024
    return out


class Sampler:
    """Samples status(pid) on a thread, each sample with its time (perf_counter)."""

    def __init__(self, pid: int, every: float = 0.1) -> None:
        self.pid, self.every = pid, every
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        try:
            self.samples.append((time.perf_counter(), status(self.pid)))
        except OSError:                 # the process is gone
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def peaks(self, phases: list[tuple[str, float]]) -> dict[str, dict[str, int]]:
        """Each field's maximum per phase; `phases` are (name, start time), in order."""
        out: dict[str, dict[str, int]] = {}
        for t, s in self.samples:
            name = [n for n, start in phases if start <= t][-1:] or [phases[0][0]]
            peak = out.setdefault(name[0], dict.fromkeys(_FIELDS, 0))
            for k, v in s.items():
                peak[k] = max(peak[k], v)
        return out


def expanded_bytes(path: Path) -> int:
    """What --weights expand would hold: every tensor as fp32."""
    return sum(int(t.n_elements) * 4 for t in gguf.GGUFReader(path).tensors)


def run(args) -> dict:

    model = Path(args.model)
    if not model.is_file():
        raise ValueError(f"--model: no file {model}")
    kv, host = parse_size(args.kv_budget, "--kv-budget"), \
        parse_size(args.host_budget, "--host-budget")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    serve = ["--weights", "keep", "--kv-budget", args.kv_budget, "--host-budget",
             args.host_budget, "--threads", str(args.threads), "--parallel", "1"]
    daemon = ManagedDaemon(str(model), out / "cache", out / "daemon.log", serve,
                           ready_timeout=1200)
    # a cold prefill on a busy 2-core machine runs past the client's default 600 s
    daemon.client = Client(daemon.client.url, timeout=args.timeout)
    t0 = time.perf_counter()
    words = " ".join(f"word{i % 97} item{i}" for i in range(args.prompt_tokens // 4))
    with daemon:
        # sampled from the spawn on: start() waits for /health on another thread
        starter = threading.Thread(target=daemon.start, daemon=True)
        starter.start()
        while daemon.proc is None and starter.is_alive():
            time.sleep(0.01)
        sampler = Sampler(daemon.proc.pid) if daemon.proc is not None else None
        starter.join()
        if sampler is None or daemon.proc is None:
            raise RuntimeError(f"the daemon did not start; its log:\n{daemon.tail()}")
        phases = [("load", t0), ("prefill", time.perf_counter())]
        first = daemon.client.complete(words, args.decode, ignore_eos=True)
        phases.append(("decode", phases[-1][1] + first.ttft_ms / 1000))
        phases.append(("cached repeat", time.perf_counter()))
        again = daemon.client.complete(words, args.decode, ignore_eos=True)
        sampler.stop()
        final = status(daemon.proc.pid)
    peaks = sampler.peaks(phases)
    size = model.stat().st_size
    bound = 1.3 * size + kv + host
    return {
        "model": str(model), "file_bytes": size, "kv_budget": kv, "host_budget": host,
        "bound_bytes": int(bound), "peak_rss_bytes": final["VmHWM"],
        "within_bound": final["VmHWM"] <= bound, "final": final, "phases": peaks,
        "load_s": round(phases[1][1] - t0, 1), "prompt_n": first.prompt_n,
        "prefill_s": round(first.ttft_ms / 1000, 1),
        "decode_tps": round((first.completion_n or 0) * 1000
                            / max(first.total_ms - first.ttft_ms, 1e-9), 2),
        "repeat_cached_n": again.cache_n, "repeat_ttft_s": round(again.ttft_ms / 1000, 2),
        "same_text": first.text == again.text,
        "expand_would_need_bytes": expanded_bytes(model),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--kv-budget", default="512MiB")
    p.add_argument("--host-budget", default="512MiB")
    p.add_argument("--prompt-tokens", type=int, default=400)
    p.add_argument("--decode", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=float, default=3600, help="seconds per request")
    p.add_argument("--out", default="bench-out/big-rss")
    args = p.parse_args(argv)
    try:
        result = run(args)
    except (ValueError, RuntimeError, OSError) as e:
        raise SystemExit(f"big_rss: {e}") from None
    gib = 2 ** 30
    for phase, peak in result["phases"].items():
        print(f"{phase:>14}: " + "  ".join(f"{k} {v / gib:.2f}" for k, v in peak.items())
              + " GiB")
    print(f"peak RSS {result['peak_rss_bytes'] / gib:.2f} GiB vs bound "
          f"{result['bound_bytes'] / gib:.2f} GiB (1.3 x {result['file_bytes'] / gib:.2f} "
          f"+ {result['kv_budget'] / gib:.2f} + {result['host_budget'] / gib:.2f}): "
          f"{'within' if result['within_bound'] else 'OVER'}; --weights expand would "
          f"need {result['expand_would_need_bytes'] / gib:.1f} GiB of weights")
    Path(args.out, "big_rss.json").write_text(json.dumps(result, indent=1))
    return 0 if result["within_bound"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

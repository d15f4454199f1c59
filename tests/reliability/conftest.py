"""What the reliability tests share: daemon settings small enough for CI, greedy requests
whose tokens can be compared, a SIGKILL, and a private filesystem for disk faults."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest

from tests.daemon.daemon_proc import Daemon

# One torch thread: on a 2-core machine shared with other work, two OpenMP threads
# that wait on each other make a 20 ms prefill take seconds now and then (measured:
# 10-70 ms per request with one thread, up to 2.3 s with two), and these tests are
# about answers and faults, not about torch's threading.
ENV = {"OMP_NUM_THREADS": "1"}
# A small context and frequent snapshots, so short prompts leave restorable state.
ARGS = ("--max-context", "1024", "--snapshot-interval", "32", "--step-tokens", "128",
        "--request-timeout", "120", "--drain-timeout", "5")


def greedy(d: Daemon, prompt: list[int], n: int = 4, cache: bool = True,
           salt: str | None = None, timeout: float = 120) -> tuple[list[int], int]:
    """(generated token ids, cached prompt tokens) of a greedy /completion."""
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True,
            "cache_prompt": cache, "return_tokens": True}
    if salt is not None:
        body["cache_salt"] = salt
    r = d.post("/completion", body, timeout=timeout)
    assert r.status == 200, r.text
    return r.json["tokens"], r.json["tokens_cached"]


def kill9(d: Daemon) -> None:
    """SIGKILL: no drain, no flush, no close; only what LMDB committed survives."""
    if d.proc.poll() is None:
        d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(30)
    d.log.close()


def stats(d: Daemon) -> dict:
    r = d.get("/cache/stats")
    assert r.status == 200, r.text
    return r.json


def wait_written(d: Daemon, timeout: float = 60) -> dict:
    """Until the write-behind queue is empty: everything put so far is committed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = stats(d)
        if s["write_queue"]["depth"] == 0:
            return s
        time.sleep(0.05)
    raise TimeoutError("the write queue did not drain")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def _can_mount() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    r = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                       capture_output=True, timeout=30)
    return r.returncode == 0


@pytest.fixture(scope="session")
def can_mount() -> bool:
    return _can_mount()


def in_tmpfs(where, options: str) -> tuple[str, ...]:
    """Wrap a daemon so that `where` is a fresh tmpfs (say size=1m, or ro) in a mount
    namespace of its own: nothing to unmount afterwards, nothing seen outside."""
    return ("unshare", "-m", "sh", "-c", f'mount -t tmpfs -o {options} tmpfs "{where}" && '
            'exec "$0" "$@"')

"""bench kept_weights' CPU-seconds count a server's whole process tree (ckptd serve's
work may run in its children)."""

from __future__ import annotations

import os
import subprocess
import sys

from ckptd.tools.bench.kept_weights import _cpu_s


def test_cpu_seconds_count_the_children():
    before = _cpu_s(os.getpid())
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.4: pass\n"
                              "print(flush=True)\ntime.sleep(30)"],
                             stdout=subprocess.PIPE)
    try:
        child.stdout.readline()              # it has burnt its 0.4 s and sleeps
        spent = _cpu_s(os.getpid()) - before
        assert spent >= 0.35, spent
        assert _cpu_s(child.pid) >= 0.35
    finally:
        child.kill()
        child.wait()

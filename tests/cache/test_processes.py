"""Real processes: SIGKILL during batched writes, and a read-only reader beside a writer."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from ckptd.cache.store.store import CacheStore
from tests.cache.conftest import FP, check_restored, hybrid_spec

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _start_writer(path: Path, first: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "tests.cache.writer_proc", str(path), str(first)],
                         cwd=ROOT, stdout=subprocess.PIPE, env=ENV)
    assert p.stdout.readline().strip() == b"ready"
    return p


def _tokens_of(store: CacheStore, meta) -> list[int]:
    """A snapshot's whole prompt, from the tokens stored along its chain of blocks."""
    toks = list(meta.tokens)
    parent = store.catalog.index.get(meta.parent)
    while parent is not None:
        toks = list(parent.tokens) + toks
        parent = store.catalog.index.get(parent.parent)
    return toks


def test_sigkill_during_writes_leaves_only_whole_entries(tmp_path):
    spec = hybrid_spec()
    rng = random.Random(1)
    committed_before = set()
    for round_ in range(3):
        p = _start_writer(tmp_path, round_ * 1000)
        time.sleep(rng.uniform(0.2, 0.8))
        p.send_signal(signal.SIGKILL)
        p.wait()
        store = CacheStore(tmp_path, spec, FP)
        keys = set(store.catalog.index.rows)
        assert committed_before <= keys                   # committed entries survive
        committed_before = keys
        report = store.verify()
        assert report.checked == len(keys) and not report.bad and not report.orphans
        snaps = [m for m in store.catalog.index.rows.values() if m.kind == "snapshot"]
        assert snaps
        for meta in rng.sample(snaps, min(12, len(snaps))):
            toks = _tokens_of(store, meta)
            plan = store.lookup(toks + [0])
            assert plan.position == len(toks)           # served only with all its blocks
            restored = store.load(plan)
            assert restored.ok
            check_restored(spec, restored, toks)
        store.close()
    assert len(committed_before) > 0


READER = """
import sys, time
from ckptd.cache.store.store import CacheStore
deadline = time.time() + 60
while True:            # the writer may be creating the store right now
    try:
        s = CacheStore.open_readonly(sys.argv[1])
        break
    except FileNotFoundError:
        assert time.time() < deadline
        time.sleep(0.02)
while s.stats()["disk"]["entries"] == 0 and time.time() < deadline:
    time.sleep(0.05)
for _ in range(6):
    n = s.stats()["disk"]["entries"]
    rows = s.entries(limit=5)
    assert all(r.stored_bytes > 0 for r in rows)
    print(n, len(rows), flush=True)
    time.sleep(0.3)
try:
    s.clear()
except ValueError as e:
    print("refused:", e)
"""


def test_second_process_reads_while_first_writes(tmp_path):
    # Both start at once (each spends seconds importing torch); the reader waits for data.
    reader = subprocess.Popen([sys.executable, "-c", READER, str(tmp_path)], cwd=ROOT, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writer = _start_writer(tmp_path, 0)
    try:
        out, err = reader.communicate(timeout=120)
        assert reader.returncode == 0, err
        lines = out.splitlines()
        counts = [int(line.split()[0]) for line in lines[:6]]
        assert counts[0] > 0 and counts[-1] > counts[0]   # it sees the writer's progress
        assert lines[-1].startswith("refused:") and "read-only" in lines[-1]
    finally:
        writer.kill()
        writer.wait()
        reader.kill()

"""Real processes: SIGKILL during batched writes, and a read-only reader beside a writer."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from cache import codec
from cache.store import CacheStore
from tests.cache.conftest import B, fake_pages, fake_snapshot, hybrid_spec

ROOT = Path(__file__).resolve().parents[2]


def _start_writer(path, start):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "tests.cache.writer_proc", str(path), str(start)],
                         cwd=ROOT, stdout=subprocess.PIPE, env=env)
    assert p.stdout.readline().strip() == b"ready"
    return p


def test_sigkill_during_writes_loses_nothing_committed(tmp_path):
    spec = hybrid_spec()
    rng = random.Random(0)
    seen = 0
    for round_ in range(3):
        p = _start_writer(tmp_path, round_ * 1000)
        time.sleep(rng.uniform(0.3, 1.2))
        p.send_signal(signal.SIGKILL)
        p.wait()
        store = CacheStore(tmp_path, spec, "fp-test")
        entries = store.disk.scan()
        assert len(entries) >= seen                       # committed entries survive
        seen = len(entries)
        for key, _ in entries:                            # everything found is whole
            codec.decode(store.disk.get(key), "fp-test")
        snaps = [(k, m) for k, m in entries if m.kind == "snapshot"]
        for key, meta in rng.sample(snaps, min(15, len(snaps))):
            if meta.kind == "snapshot":
                # a snapshot is served only with all its blocks, and then exactly
                toks = _tokens_of(store, key, meta)
                plan = store.lookup(toks + [0])
                assert plan.position == len(toks)
                r = store.load(plan)
                assert r.ok and torch.equal(r.snapshot["ssm"], fake_snapshot(spec, toks)["ssm"])
                if len(toks) >= B:
                    assert torch.equal(r.pages, fake_pages(spec, toks, 0, len(toks) // B))
        store.close()
    assert seen > 0


def _tokens_of(store, key, meta):
    toks = list(meta.tokens)
    parent = meta.parent
    while True:
        m = store.disk.meta(bytes.fromhex(parent))
        if m is None:
            return toks
        toks = list(m.tokens) + toks
        parent = m.parent


def test_second_process_reads_while_first_writes(tmp_path):
    p = _start_writer(tmp_path, 0)
    try:
        time.sleep(0.5)
        counts = []
        for _ in range(3):
            out = subprocess.run(
                [sys.executable, "-c",
                 "import sys; from cache.store import CacheStore; "
                 "s = CacheStore.open_readonly(sys.argv[1]); print(len(s.disk.scan()))",
                 str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                env={**os.environ, "PYTHONPATH": str(ROOT)})
            assert out.returncode == 0, out.stderr
            counts.append(int(out.stdout))
            time.sleep(0.3)
        assert counts[-1] > counts[0] > 0                 # it sees the writer's progress
    finally:
        p.kill()
        p.wait()

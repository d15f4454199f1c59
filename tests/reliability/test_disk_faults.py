"""Disk faults: a budget far too small, a filesystem that fills up, a cache folder that
can't be used. The daemon keeps serving correct answers; lost writes are counted."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys

import pytest

from tests.daemon.daemon_proc import ROOT, start
from tests.reliability.conftest import ARGS, ENV, greedy, in_tmpfs, stats, wait_written


def _prompts(seed: int, n: int, length: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(length)] for _ in range(n)]


def _fill(model_dir, cache, prompts: list[list[int]]) -> None:
    """Serve each prompt once from a daemon on `cache`, its writes committed, then stop."""
    d = start(model_dir, cache, *ARGS, env=ENV)
    try:
        for p in prompts:
            greedy(d, p, n=2)
        wait_written(d)
    finally:
        assert d.stop() == 0, d.output()


def _check_repeats(d, prompts: list[list[int]]) -> int:
    """Each prompt again, cached: the tokens of the cache-off run. Returns the hits."""
    hits = 0
    for p in prompts:
        got, cached = greedy(d, p)
        want, _ = greedy(d, p, cache=False)
        assert got == want, f"{cached} cached tokens, wrong output"
        hits += cached > 0
    return hits


def test_tiny_disk_budget_evicts_and_keeps_serving(tiny_hybrid_dir, tmp_path):
    budget = 200_000
    d = start(tiny_hybrid_dir, tmp_path / "cache", *ARGS, "--disk-budget", str(budget),
              "--host-budget", "0", env=ENV)
    try:
        prompts = _prompts(1, 16, 100)
        for p in prompts:
            greedy(d, p, n=2)
        s = wait_written(d)
        assert 0 < s["disk"]["stored_bytes"] <= budget and s["evictions"] > 0, s
        # The budget holds about one prompt's blocks and snapshots: the newest is kept
        # (each check writes its prompt again, evicting the rest), the oldest are gone.
        assert _check_repeats(d, prompts[-1:]) == 1
        _check_repeats(d, prompts[:3])
        assert stats(d)["corrupt_dropped"] == 0
    finally:
        assert d.stop() == 0, d.output()


@pytest.mark.parametrize("fault", ["tmpfs-full", "file-size-limit"])
def test_full_filesystem_skips_writes_and_keeps_serving(fault, tiny_hybrid_dir, tmp_path,
                                                        can_mount):
    cache = tmp_path / "cache"
    cache.mkdir()
    if fault == "tmpfs-full":
        if not can_mount:
            pytest.skip("needs root and mount namespaces (unshare -m) for a tiny tmpfs")
        wrap = in_tmpfs(cache, "size=1m")                    # a real ENOSPC
    else:
        # The store file may not grow past 600 KB: writes past it fail (EFBIG) like
        # writes to a full disk. Python ignores SIGXFSZ, so the write just fails.
        wrap = ("prlimit", f"--fsize={600_000}", "--")
    # every interval snapshot (no byte budget): enough writes to fill the disk
    d = start(tiny_hybrid_dir, cache, *ARGS, "--host-budget", "0", "--snapshot-budget", "100",
              wrap=wrap, env=ENV)
    prompts = _prompts(2, 10, 120)
    try:
        for p in prompts:
            greedy(d, p, n=2)
        s = wait_written(d)
        q = s["write_queue"]
        assert q["map_full"] > 0, q                     # the full disk was met and counted
        assert d.get("/health").status == 200
        _check_repeats(d, prompts[:1] + prompts[-2:])
        assert stats(d)["corrupt_dropped"] == 0
    finally:
        assert d.stop() == 0, d.output()
    if fault == "file-size-limit":          # what was committed before is intact
        d = start(tiny_hybrid_dir, cache, *ARGS, env=ENV)
        try:
            assert _check_repeats(d, prompts[:3]) > 0
            assert stats(d)["corrupt_dropped"] == 0
        finally:
            assert d.stop() == 0, d.output()


def _serve(cache_dir, wrap: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*wrap, sys.executable, "-m", "ckptd.tools.cli", "serve", "--port", "0",
                           "--cache-dir", str(cache_dir)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def _one_line_exit_2(r: subprocess.CompletedProcess, words: str) -> None:
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "--cache-dir" in r.stderr, r.stderr
    assert words in r.stderr, r.stderr


def test_unusable_cache_dir_is_a_one_line_startup_error(tmp_path, can_mount):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    _one_line_exit_2(_serve(blocker / "cache"), "cannot create it")
    _one_line_exit_2(_serve(blocker), "not a folder")
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        _one_line_exit_2(_serve(locked), "not writable")
    if not can_mount:
        pytest.skip("root ignores chmod; a read-only mount needs mount namespaces")
    ro = tmp_path / "ro"
    ro.mkdir()
    _one_line_exit_2(_serve(ro, in_tmpfs(ro, "ro")), "not writable")
    _one_line_exit_2(_serve(ro / "cache", in_tmpfs(ro, "ro")), "cannot create it")


def test_flipped_bytes_in_the_store_file(tiny_hybrid_dir, tmp_path):
    """Random bits flipped anywhere in data.mdb (values, index records, LMDB's own
    pages): the daemon starts, and every answer is the cache-off one."""
    clean = tmp_path / "clean"
    prompts = _prompts(3, 6, 90)
    _fill(tiny_hybrid_dir, clean, prompts)
    for seed, flips in [(1, 3), (2, 30), (3, 300)]:
        cache = tmp_path / f"flipped-{seed}"
        shutil.copytree(clean, cache)
        data = bytearray((cache / "data.mdb").read_bytes())
        rng = random.Random(seed)
        for _ in range(flips):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        (cache / "data.mdb").write_bytes(bytes(data))
        d = start(tiny_hybrid_dir, cache, *ARGS, env=ENV)
        try:
            hits = _check_repeats(d, prompts)
            s = stats(d)
            aside = any(p.name.startswith("damaged-") for p in cache.iterdir())
            print(f"{flips} flips (seed {seed}): {hits} hits of {len(prompts)}, "
                  f"{s['corrupt_dropped']} values dropped, file set aside: {aside}")
        finally:
            assert d.stop() == 0, d.output()


def test_a_store_shared_with_another_model_serves_each_its_own(tiny_hybrid_dir,
                                                               tiny_llama_dir, tmp_path):
    cache = tmp_path / "cache"
    prompts = _prompts(4, 2, 70)
    _fill(tiny_hybrid_dir, cache, prompts)
    d = start(tiny_llama_dir, cache, *ARGS, env=ENV)
    try:
        for p in prompts:                   # keys are rooted in the model fingerprint
            assert greedy(d, p, n=2)[1] == 0
        assert _check_repeats(d, prompts) == len(prompts)   # its own entries, correct
    finally:
        assert d.stop() == 0, d.output()
    d = start(tiny_hybrid_dir, cache, *ARGS, env=ENV)
    try:
        assert _check_repeats(d, prompts) == len(prompts)   # the first model's are kept
    finally:
        assert d.stop() == 0, d.output()

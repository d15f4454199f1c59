"""The concurrency benchmark on a real tiny daemon: its figures add up to what it sent."""

from __future__ import annotations

import json

import pytest

from ckptd.tools.bench import concurrency as bench_concurrency
from tests.daemon.daemon_proc import start


def test_percentile_interpolates_between_ranks():
    assert bench_concurrency.percentile([3.0], 99) == 3.0
    assert bench_concurrency.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert bench_concurrency.percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0
    with pytest.raises(ValueError):
        bench_concurrency.percentile([], 50)


def test_levels_against_a_tiny_daemon(tiny_hybrid_dir, tmp_path):
    d = start(tiny_hybrid_dir, tmp_path / "cache", "--max-context", "1024", "--parallel", "4",
              "--snapshot-interval", "64")
    try:
        out = tmp_path / "out"
        code = bench_concurrency.main(["--url", d.url, "--prefix-tokens", "200",
                                       "--clients", "1,3", "--requests", "2",
                                       "--max-tokens", "3", "--out", str(out)])
        assert code == 0
        rows = json.loads((out / "results.json").read_text())["rows"]
    finally:
        assert d.stop() == 0, d.output()
    assert [(r["clients"], r["requests"]) for r in rows] == [(1, 2), (3, 6)]
    for r in rows:
        assert r["ttft_p99_ms"] >= r["ttft_p50_ms"] > 0
        # every request restored the shared prefix: most of its prompt was cached
        assert r["mean_cached_tokens"] >= 0.8 * 200
    assert "| ckptd | 3 | 6 |" in (out / "report.md").read_text()


def test_bad_client_counts_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        bench_concurrency.main(["--url", "http://127.0.0.1:1", "--clients", "0"])
    assert e.value.code == 2
    assert "--clients" in capsys.readouterr().err

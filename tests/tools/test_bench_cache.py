"""tools/bench/cache at toy lengths: every phase restores the whole context from the tier
it names, and the report, figures and plot are written."""

from __future__ import annotations

import json

from ckptd.tools.bench import cache as bench_cache


def test_bench_cache_smoke(tmp_path):
    out = tmp_path / "out"
    code = bench_cache.main(["--models", "tiny-hybrid", "--lengths", "64,128", "--interval", "64",
                             "--question", "4", "--repeat", "2", "--out", str(out),
                             "--store-dir", str(tmp_path / "stores"), "--keep-page-cache"])
    assert code == 0
    rows = json.loads((out / "results.json").read_text())
    assert [r["length"] for r in rows] == [64, 128]
    for r in rows:
        assert set(r["ttft_ms"]) == set(bench_cache.PHASES)
        assert r["cached"] == {"cold": 0, "device": r["length"], "host": r["length"],
                               "disk": r["length"]}
        assert r["tier"] == {"cold": None, "device": "host", "host": "host", "disk": "disk"}
        assert r["stored_per_token"] > 0 and r["logical_per_token"] > 0
    report = (out / "report.md").read_text()
    assert report.count("| tiny-hybrid |") == 2
    assert (out / "ttft_by_length.png").stat().st_size > 0
    assert bench_cache.main(["--lengths", "100", "--out", str(out)]) == 2   # not a block multiple

"""tools/bench/restore_decode.py: both ways of decoding give the pages back bit for bit."""

from __future__ import annotations

from ckptd.tools.bench import restore_decode


def test_restore_decode_bench_runs_both_ways():
    r = restore_decode.run(blocks=40, repeat=1)
    assert r["blocks"] == 40 and r["stored_mb"] > 0
    for name in ("one_by_one", "grouped"):
        assert r[name]["cpu_s"] >= 0 and r[name]["us_per_value"] >= 0

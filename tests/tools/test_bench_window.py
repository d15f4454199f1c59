"""tools/bench/window_memory.py at a small size: the window layers' device bytes stay
within the bound it reports and far below keeping every page, and the context after a
restart, from disk, gives the uncached answer and logits."""

from __future__ import annotations

import json

from ckptd.tools.bench import window_memory


def test_a_small_context_is_window_bounded_and_answered_from_disk(tmp_path):
    out = tmp_path / "report.json"
    assert window_memory.main(["--context", "1024", "--window", "64", "--step", "128",
                               "--answer", "2", "--out", str(tmp_path / "run"),
                               "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    kv = r["device_kv_bytes"]
    assert r["rooms_most"] <= r["rooms_bound"] < r["pages"] // 2
    assert r["rooms_bound"] <= r["rooms_pool"] < r["pages"]
    assert kv["window_layers_most"] * 2 < kv["window_layers_if_kept"]
    assert kv["full_layers"] == r["pages"] * r["layers"]["full"] * r["layer_page_bytes"]
    assert r["question"]["device"] == 1024
    restart = r["restart"]
    assert restart["tier"] == "disk" and restart["cached"] >= 1024
    assert restart["same_answer"] and restart["logits_max_diff"] == 0.0
    assert {"cpu", "load_1min"} <= r.keys() and r["prefill"]["cpu_s"] >= 0

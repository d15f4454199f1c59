"""tools/bench/full_size.py's results, which a GPU call of tools/gpu_full.sh depends on:
every phase is recorded as ok, FAILED with its first error line, or SKIPPED once the
budget is spent; the JSON is rewritten after each phase (a call cut by its time limit
keeps what finished); gpu_report renders it; bad arguments are a one-line error.
(The whole script runs end to end with `tools/gpu_full.sh --dry-run`, minutes on a CPU.)"""

from __future__ import annotations

import argparse
import json
import time

import pytest

from ckptd.tools.bench import gpu_report
from ckptd.tools.bench.full_size import Run, main


def test_phases_are_saved_one_by_one_with_their_status(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    out = tmp_path / "full_size.json"
    args = argparse.Namespace(model=str(model), device="cpu", serve_args=["--parallel", "8"],
                              json=str(out))
    run = Run(args, budget=30)

    def fails():
        raise RuntimeError("the daemon did not start\nits log: ...")
    assert run.phase("start", lambda: {"load_s": 1.5}) == {
        "phase": "start", "load_s": 1.5, "status": "ok", "seconds": 0.0}
    assert json.loads(out.read_text())["phases"][0]["status"] == "ok"   # saved at once
    assert run.phase("250000 cold", fails) is None
    run.result["phases"][-1]["seconds"] = 0.0
    run.t0 -= 28                                        # 2 s of the budget left
    assert run.phase("restart", lambda: {"ttft_s": 0.1}, need=10) is None
    saved = json.loads(out.read_text())
    assert [(p["phase"], p["status"]) for p in saved["phases"]] == [
        ("start", "ok"), ("250000 cold", "FAILED"), ("restart", "SKIPPED")]
    assert saved["phases"][1]["error"] == "RuntimeError: the daemon did not start"
    saved["peaks"] = {"decode": {"device_used": 3 << 30, "rss_peak": 1 << 30}}
    saved["phases"].append({"phase": "decode batch 8", "status": "ok", "seconds": 2.0,
                            "batch": 8, "decode_tps": 812.5, "ttft_s_max": 0.25})
    out.write_text(json.dumps(saved))
    text = gpu_report.render(out)
    assert "| 250000 cold | FAILED | RuntimeError: the daemon did not start |" in text
    assert "| restart | SKIPPED |" in text and "812.5" in text
    assert "| decode | 3.00 | 1.00 |" in text


@pytest.mark.parametrize("argv, says", [
    (["--budget", "0"], "--budget must be positive"),
    (["--contexts", "250000,x"], "--contexts"),
    (["--batch", "0"], "--batch must be positive"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, capsys, argv, says):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as e:
        main(["--model", str(model), *argv])
    assert e.value.code == 2 and says in capsys.readouterr().err
    assert time.monotonic() - t0 < 5
    with pytest.raises(SystemExit):
        main(["--model", str(tmp_path / "missing.gguf")])

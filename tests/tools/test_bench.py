"""`ckptd bench` end to end on the tiny models: real daemons, real HTTP, real cache.

The figures it reports must agree with what the daemons say about themselves:
cold requests hit nothing, warm ones are served whole from RAM, after a restart
from disk, every later chat turn resumes at least where the last prompt ended,
and the daemon's own counters add up to the bench's rows.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

import pytest

from ckptd.tools.bench import command as bench
from ckptd.tools.bench.managed import ManagedDaemon


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def _load(out) -> list[dict]:
    return json.loads((out / "results.json").read_text())["rows"]


def test_bench_hybrid_cold_warm_restart(tiny_hybrid_dir, tmp_path):
    out = tmp_path / "out"
    code = bench.run(_args("--model", str(tiny_hybrid_dir), "--out", str(out),
                           "--cache-dir", str(tmp_path / "cache"), "--lengths", "40,150",
                           "--repeat", "2", "--max-tokens", "4", "--chat-turns", "3",
                           "--turn-tokens", "24", "--memory-tokens", "120", "--questions", "2"))
    assert code == 0
    rows = _load(out)
    named = [r for r in rows if r["server"] == "ckptd (named context)"]
    rows = [r for r in rows if r not in named]
    for r in rows + named:
        assert r["server"] == "ckptd" or r in named
        assert r["computed_n"] == r["prompt_n"] - r["cache_n"]
        t = r["timings"]              # llama-server's: prompt_n counts computed tokens
        assert t["prompt_n"] + t["cache_n"] == r["prompt_n"]
        # The client waits at least as long as the daemon's queue + restore + prefill.
        assert r["ttft_ms"] >= r["server_ttft_ms"] > 0
        assert r["total_ms"] >= r["ttft_ms"]

    ctx = {(r["length"], r["phase"], r["rep"]): r for r in rows if r["scenario"] == "context"}
    assert {k[1] for k in ctx} == {"cold", "warm", "restart"}
    for length in (40, 150):
        for rep in (0, 1):
            cold, warm = ctx[length, "cold", rep], ctx[length, "warm", rep]
            # a cold prompt shares nothing but, by chance, its first token or two with an
            # earlier one (the openings are random letters); a branch point there is a
            # real, tiny hit
            assert cold["cache_n"] < 4 and cold["cache_tier"] in (None, "host")
            assert abs(cold["prompt_n"] - length) <= max(4, length // 50)
            assert warm["cache_n"] == warm["prompt_n"] == ctx[length, "cold", 1]["prompt_n"]
            assert warm["cache_tier"] == "host"
        restart = ctx[length, "restart", 0]
        assert restart["cache_tier"] == "disk"
        assert restart["cache_n"] == restart["prompt_n"] == warm["prompt_n"]

    chat = [r for r in rows if r["scenario"] == "chat"]
    assert [r["turn"] for r in chat] == [1, 2, 3]
    assert chat[0]["cache_n"] == 0
    for prev, cur in zip(chat, chat[1:]):
        assert cur["prompt_n"] > prev["prompt_n"]
        assert cur["cache_n"] >= prev["prompt_n"]      # the last prompt's end snapshot

    mem = [r for r in rows if r["scenario"] == "memory"]
    store, questions = mem[0], mem[1:]
    assert store["request"] == "store" and store["cache_n"] == 0 and len(questions) == 2
    for q in questions:
        assert q["cache_n"] == store["prompt_n"]
        assert q["computed_n"] == q["prompt_n"] - store["prompt_n"]

    # the same questions, each sending only its own text and naming the stored context
    assert [r["request"] for r in named] == ["store", "question 1", "question 2"]
    assert named[0]["cache_n"] == 0 and abs(named[0]["prompt_n"] - 120) <= 8  # another text
    for q, plain in zip(named[1:], questions):
        assert q["cache_n"] == named[0]["prompt_n"]
        assert 0 < q["computed_n"] <= plain["computed_n"] + 1

    report = (out / "report.md").read_text()
    assert "| ckptd | 150 |" in report and "after restart" in report and "disk" in report
    assert "ckptd (named context): mean TTFT per question" in report
    for png in ("ttft_by_context.png", "chat_turns.png", "memory_questions.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "listening on" in (out / "daemon.log").read_text()


def test_bench_against_a_peer_agrees_with_its_counters(tiny_llama_dir, tmp_path):
    """A second daemon on the same model stands in for llama.cpp as the peer: both see
    the very same prompts, and the peer's own counters match the bench's rows."""
    out = tmp_path / "out"
    with ManagedDaemon(str(tiny_llama_dir), tmp_path / "peer-cache",
                       tmp_path / "peer.log") as peer:
        peer.start()
        code = bench.run(_args("--model", str(tiny_llama_dir), "--out", str(out),
                               "--peer", peer.client.url, "--peer-name", "other",
                               "--scenarios", "chat,memory", "--max-tokens", "3",
                               "--chat-turns", "2", "--turn-tokens", "20",
                               "--memory-tokens", "100", "--questions", "2", "--no-plots"))
        assert code == 0
        status, stats = peer.client.request("GET", "/cache/stats")
    assert status == 200
    rows = _load(out)
    mine = [r for r in rows if r["server"] == "ckptd"]
    other = [r for r in rows if r["server"] == "other"]
    assert len(mine) == len(other) == 2 + 3
    mem = lambda rs: [r for r in rs if r["scenario"] == "memory"]
    assert [r["prompt_n"] for r in mem(mine)] == [r["prompt_n"] for r in mem(other)]
    # The store request is cold on both, but an attention-only model may reuse a first
    # token that its run-unique opening shares by chance with an earlier prompt.
    assert all(m[0]["cache_n"] <= 2 for m in (mem(mine), mem(other)))
    assert [r["cache_n"] for r in mem(mine)[1:]] == [r["cache_n"] for r in mem(other)[1:]]
    sched = stats["scheduler"]
    assert sched["cached_tokens"] == sum(r["cache_n"] for r in other)
    # The peer also saw the bench's uncounted warm-up request.
    assert sched["prompt_tokens"] > sum(r["prompt_n"] for r in other)
    report = (out / "report.md").read_text()
    assert "| other | question 2 |" in report and "| ckptd | question 2 |" in report
    assert "- ckptd: mean TTFT per question" in report
    assert re.search(r"- ckptd: mean TTFT per question .* ms, \d+\.\dx (faster|slower) "
                     r"than other", report)
    assert not re.search(r"- other: .* than ", report)         # the peer is the yardstick
    assert not list(out.glob("*.png"))


def test_bench_restarts_a_peer_it_started(tiny_llama_dir, tmp_path):
    """--peer-command: the bench starts the peer (here another ckptd), and restarts it
    when it restarts its own daemon; a ckptd peer then answers from its disk tier."""
    out = tmp_path / "out"
    cmd = (f"{sys.executable} -m ckptd.tools.cli serve --port {{port}} --model {tiny_llama_dir} "
           f"--cache-dir {tmp_path / 'peer-cache'}")
    code = bench.run(_args("--model", str(tiny_llama_dir), "--out", str(out),
                           "--peer-command", cmd, "--peer-name", "other",
                           "--scenarios", "context", "--lengths", "60", "--max-tokens", "2",
                           "--no-plots"))
    assert code == 0
    rows = _load(out)
    for server in ("ckptd", "other"):
        phases = {r["phase"]: r for r in rows if r["server"] == server}
        assert set(phases) == {"cold", "warm", "restart"}
        assert phases["restart"]["cache_tier"] == "disk"
        assert phases["restart"]["cache_n"] == phases["restart"]["prompt_n"]
    assert "listening on" in (out / "peer.log").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--url", "http://127.0.0.1:1", "--model", "x"], "not both"),
    (["--url", "http://127.0.0.1:1", "--serve-arg=--parallel=2"], "only to a daemon"),
    (["--lengths", "64,abc"], "comma-separated integers"),
    (["--lengths", "0"], "positive integers"),
    (["--scenarios", "context,nope"], "unknown nope"),
    (["--repeat", "0"], "--repeat must be >= 1"),
    (["--peer", "http://127.0.0.1:1", "--peer-command", "x {port}"], "not both"),
    (["--peer-command", "llama-server --port 8090"], "must contain {port}"),
])
def test_bad_arguments_name_the_flag(argv, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        bench.run(_args(*argv, "--out", str(tmp_path)))


def test_missing_model_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        bench.run(_args("--model", str(tmp_path / "no-such-model"), "--out", str(tmp_path)))


def test_admission_bench_measures_the_miss_accounting_side_by_side(tmp_path):
    from ckptd.tools.bench import admission

    out = tmp_path / "rows.json"
    assert admission.main(["--lengths", "2048", "--snapshots", "8", "--repeat", "2",
                           "--why-cost", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    for phase in ("device", "host", "disk"):
        r = row[phase]
        assert r["admit_ms_without_why"] > 0 and r["admit_ms"] > 0
        assert 0 < r["why_us"] < 1000 * r["admit_ms"] and r["explain_us"] > 0
        assert r["restored"] == [2048]              # a snapshot at the context's end
        assert phase == "device" or 0 < r["evict_record_us_per_page"] < 1000   # dropped first

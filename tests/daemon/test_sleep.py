"""Sleeping (--sleep-idle-seconds) and backend sampling on a real daemon on loopback.

A hybrid (recurrent snapshots and KV pages) answers a prompt, sleeps, wakes on the
same prompt and restores it from the host tier: the same tokens as the first, uncached
answer. SmolLM2 (the embedded model) shows the point of sleeping: RSS drops."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.daemon.daemon_proc import start

PROMPT = "The quick brown fox jumps over the lazy dog. " * 6


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _sleeping(d) -> bool:
    r = d.get("/props")
    assert r.status == 200, r.text
    return r.json["is_sleeping"]


def _wait_asleep(d, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _sleeping(d):
            return
        time.sleep(0.1)
    raise AssertionError(f"not asleep after {timeout} s:\n{d.output()}")


def _complete(d, prompt: str, **kw) -> dict:
    r = d.post("/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0.0, **kw})
    assert r.status == 200, r.text
    return r.json


@pytest.fixture(scope="module")
def hybrid(tiny_hybrid_dir, tmp_path_factory):
    d = start(tiny_hybrid_dir, tmp_path_factory.mktemp("sleep") / "cache",
              "--max-context", "512", "--parallel", "2", "--step-tokens", "64",
              "--sleep-idle-seconds", "1")
    yield d
    assert d.stop() == 0, d.output()


def test_wake_restores_the_cached_prompt_and_answers_as_uncached(hybrid):
    first = _complete(hybrid, PROMPT)
    assert first["timings"]["cache_n"] == 0           # computed: nothing was cached
    _wait_asleep(hybrid)
    for path in ("/health", "/models", "/slots", "/metrics", "/props"):
        assert hybrid.get(path).status == 200, path
    assert _sleeping(hybrid)                          # those reads did not wake it
    again = _complete(hybrid, PROMPT)
    assert not _sleeping(hybrid)
    assert again["content"] == first["content"]
    n = again["tokens_evaluated"]
    assert again["timings"]["cache_n"] >= n - 16      # restored up to its last block
    assert "sleeping after 1 s idle" in hybrid.output()


def test_tokenize_wakes_and_metrics_do_not(hybrid):
    _wait_asleep(hybrid)
    a, b = hybrid.get("/metrics").text, hybrid.get("/metrics").text
    assert "llamacpp:predicted_tokens_seconds" in a and _sleeping(hybrid)
    # the snapshot's second reading has an empty throughput window, the rest as taken
    assert [x for x in a.splitlines() if "tokens_seconds " not in x] == \
        [x for x in b.splitlines() if "tokens_seconds " not in x]
    r = hybrid.post("/tokenize", {"content": "hello"})
    assert r.status == 200 and r.json["tokens"]
    assert not _sleeping(hybrid)


def test_backend_sampling_draws_what_host_sampling_draws(hybrid):
    def run(backend: bool) -> dict:
        return _complete(hybrid, "Once upon a time", n_predict=12, temperature=0.9,
                         top_k=40, top_p=0.95, min_p=0.05, seed=4242, n_probs=5,
                         post_sampling_probs=True, backend_sampling=backend)
    dev, host = run(True), run(False)
    assert dev["generation_settings"]["backend_sampling"] is True
    assert dev["content"] == host["content"]
    for a, b in zip(dev["completion_probabilities"], host["completion_probabilities"],
                    strict=True):
        assert a["id"] == b["id"] and a["prob"] == pytest.approx(b["prob"], abs=1e-4)
        assert [x["id"] for x in a["top_probs"]] == [x["id"] for x in b["top_probs"]]
        for x, y in zip(a["top_probs"], b["top_probs"]):
            assert x["prob"] == pytest.approx(y["prob"], abs=1e-4)
    # a chain it cannot run (a repetition penalty) is sampled on the host: same answer
    pen = dict(repeat_penalty=1.3, repeat_last_n=16)
    assert run_with(hybrid, True, pen) == run_with(hybrid, False, pen)


def run_with(d, backend: bool, extra: dict) -> str:
    return _complete(d, "Once upon a time", n_predict=12, temperature=0.9, seed=7,
                     backend_sampling=backend, **extra)["content"]


def test_sleeping_frees_smollm2s_memory(tmp_path):
    d = start(None, tmp_path / "cache", "--max-context", "512", "--parallel", "1",
              "--sleep-idle-seconds", "1")
    try:
        first = _complete(d, PROMPT, n_predict=4)
        awake = _rss_mib(d.proc.pid)
        _wait_asleep(d)
        asleep = _rss_mib(d.proc.pid)
        assert asleep < awake - 80, (awake, asleep)   # its weights: ~100 MiB as kept
        again = _complete(d, PROMPT, n_predict=4)
        assert again["content"] == first["content"] and again["timings"]["cache_n"] > 0
        _wait_asleep(d)                               # SIGTERM while asleep: a clean exit
    finally:
        assert d.stop() == 0, d.output()


def test_a_failed_wake_up_is_a_503_and_the_daemon_stays(tiny_hybrid_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_hybrid_dir, model)
    d = start(model, tmp_path / "cache", "--max-context", "256", "--parallel", "1",
              "--sleep-idle-seconds", "1")
    try:
        first = _complete(d, PROMPT)
        _wait_asleep(d)
        weights = next(model.glob("*.safetensors"))
        weights.rename(tmp_path / "away")            # the model can't load now
        r = d.post("/completion", {"prompt": PROMPT, "n_predict": 8})
        assert r.status == 503 and "failed to load after sleeping" in r.text, r.text
        assert d.get("/health").status == 200 and _sleeping(d)
        (tmp_path / "away").rename(weights)          # back: the next request wakes it
        assert _complete(d, PROMPT)["content"] == first["content"]
    finally:
        assert d.stop() == 0, d.output()

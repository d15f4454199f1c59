"""Long contexts on the daemon's defaults: the model's whole context without flags,
questions that compute only themselves (before and after a SIGKILL), a prompt the KV
memory can't hold refused with a 4xx, and a disk writer held back shedding interval
snapshots first. Answers are compared with uncached computations."""

from __future__ import annotations

import threading

import lmdb
import torch

from ckptd.cache.manager import CacheManager
from ckptd.model.loader import load_model
from ckptd.model.runner import Runner
from tests.daemon.daemon_proc import start
from tests.reliability.conftest import ENV, greedy, kill9, stats, wait_written

DOC = 65536
ANSWER = 4


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def uncached_answers(model_dir, doc: list[int], questions: list[list[int]]) -> list[list[int]]:
    """Greedy answers computed in process with no store: the document once, then each
    question from a fork of its state (the same state a fresh prefill computes)."""
    model = load_model(model_dir)
    B = 16
    pages = (len(doc) + 1024) // B + 64 * len(questions)
    runner = Runner(model, pages, len(questions) + 1, B, max_batch_tokens=8192)
    cache = CacheManager(runner, runner.spec, pages, model.fingerprint)
    base, _ = cache.start(doc)
    while base.num_computed < len(doc):
        n = min(8192, len(doc) - base.num_computed)
        cache.prepare([(base, n)])
        runner.step([(base, n)])
    out = []
    for q in questions:
        seq = cache.fork(base)
        seq.tokens += q
        tokens = []
        for _ in range(ANSWER):
            n = len(seq.tokens) - seq.num_computed
            cache.prepare([(seq, n)])
            t = int(runner.step([(seq, n)])[0].argmax())
            tokens.append(t)
            seq.tokens.append(t)
        out.append(tokens)
        cache.release(seq)
    return out


def test_a_long_document_on_the_defaults_then_questions_that_compute_only_themselves(
        tiny_hybrid_dir, tmp_path):
    doc = _prompt(DOC, 5)
    questions = [_prompt(12 + 2 * i, 50 + i) for i in range(5)]
    want = uncached_answers(tiny_hybrid_dir, doc, questions)
    cache = tmp_path / "cache"
    d = start(tiny_hybrid_dir, cache, env=ENV)           # no context flags at all
    try:
        limit = d.get("/v1/models").json["data"][0]["meta"]["n_ctx"]
        assert limit == 262144                           # the model's own limit
        for i, q in enumerate(questions):
            got, cached = greedy(d, doc + q, n=ANSWER, timeout=600)
            assert got == want[i], f"question {i}"
            if i >= 1:                                   # from a tail snapshot on
                assert len(doc) + len(q) - cached <= 64 + len(q), (i, cached)
        wait_written(d)
    finally:
        kill9(d)
    d = start(tiny_hybrid_dir, cache, env=ENV)           # after SIGKILL
    try:
        for i, q in enumerate(questions):
            got, cached = greedy(d, doc + q, n=ANSWER, timeout=600)
            assert got == want[i], f"question {i} after the restart"
            assert len(doc) + len(q) - cached <= 64, (i, cached)
    finally:
        assert d.stop() == 0, d.output()


def test_a_prompt_beyond_the_kv_memory_gets_a_4xx_and_the_next_is_served(tiny_hybrid_dir,
                                                                         tmp_path):
    # 64 pages of 16 tokens (4 KiB each): 1,024 tokens for every sequence together
    d = start(tiny_hybrid_dir, tmp_path / "cache", "--kv-budget", str(64 * 4096), env=ENV)
    try:
        r = d.post("/completion", {"prompt": _prompt(2000, 1), "n_predict": 2})
        assert r.status == 400, r.text
        err = r.json["error"]
        assert err["code"] == "context_length_exceeded" and "--kv-budget" in err["message"]
        assert err["param"] == "prompt"
        got, _ = greedy(d, _prompt(300, 2), n=2)
        assert len(got) == 2
    finally:
        assert d.stop() == 0, d.output()


def test_a_writer_held_back_sheds_interval_snapshots_first(tiny_hybrid_dir, tmp_path):
    """The disk writer is held by another process's LMDB write transaction (a real
    store, blocked the way a slow disk blocks it): interval snapshots are shed and
    counted, the end-of-prompt ones wait their turn and reach the disk, and answers
    stay right."""
    cache = tmp_path / "cache"
    d = start(tiny_hybrid_dir, cache, "--snapshot-interval", "32", "--snapshot-budget", "50",
              "--write-queue", "500KB", "--step-tokens", "64", env=ENV)
    env = lmdb.open(str(cache), max_dbs=8)
    held = env.begin(write=True)                         # the writer lock, across processes
    released = threading.Event()
    try:
        prompts = [_prompt(600, 10 + i) for i in range(3)]
        answers = [greedy(d, p, n=2) for p in prompts]
        s = stats(d)["write_queue"]
        assert s["shed"].get("interval", 0) > 0, s
        assert not any(s["shed"].get(role, 0) for role in ("end", "branch", "tail")), s
        metrics = d.get("/metrics").text
        assert 'ckptd_cache_dropped_writes_total{reason="interval"}' in metrics
        held.abort()
        released.set()
        wait_written(d)
        for p, (got, _) in zip(prompts, answers):
            again, cached = greedy(d, p, n=2)
            want, _ = greedy(d, p, n=2, cache=False)
            assert again == got == want and cached == len(p)   # its end snapshot is there
    finally:
        if not released.is_set():
            held.abort()
        env.close()
        assert d.stop() == 0, d.output()
    assert "writes shed" in d.output()                   # logged once for the burst

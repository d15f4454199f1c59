"""A daemon's life: loading behind a 503, API keys, restart with its cache and contexts,
SIGTERM (drain or cancel, exit 0), bad flags (exit 2)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time

from ckptd.daemon.config import ServeConfig
from tests.daemon.daemon_proc import ROOT, Daemon, start

KEY = "s3cret-key"


def _open_stream(d: Daemon, body: dict) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    r = conn.getresponse()
    assert r.status == 200
    return r


def _events(r: http.client.HTTPResponse) -> list:
    out = []
    for line in r:
        if line.startswith(b"data: "):
            data = line[6:].strip()
            out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


def test_default_model_loads_behind_a_503_then_answers(tmp_path):
    d = Daemon(None, tmp_path / "cache", "--max-context", "512", "--parallel", "1")
    try:
        seen = d.wait_ready(timeout=180)
        assert seen[0] == 503 and seen[-1] == 200           # the GGUF takes seconds to load
        model = d.get("/v1/models").json["data"][0]["id"]
        assert model.startswith("SmolLM2-135M-Instruct")
        out = d.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 12, "temperature": 0}).json
        assert "Paris" in out["choices"][0]["message"]["content"], out
    finally:
        assert d.stop() == 0, d.output()


def test_api_key_restart_keeps_contexts_and_sigterm_exits_zero(tiny_hybrid_dir, tmp_path):
    cache = tmp_path / "cache"
    d = start(tiny_hybrid_dir, cache, "--api-key", KEY, "--max-context", "1024",
              "--drain-timeout", "60")
    try:
        assert d.get("/health").status == 200                 # open without a key
        r = d.get("/v1/models")
        assert r.status == 401 and r.json["error"]["code"] == "missing_api_key"
        r = d.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        assert r.status == 401 and r.json["error"]["code"] == "invalid_api_key"
        assert d.get("/metrics").status == 401
        d.headers = {"Authorization": f"Bearer {KEY}"}
        ctx = d.post("/v1/contexts", {"name": "kb", "text": "Memory, context, prefix. " * 20})
        assert ctx.status == 201, ctx.text
        n_ctx = ctx.json["tokens"]

        # SIGTERM while a stream runs: the daemon lets it finish, then exits 0
        r = _open_stream(d, {"prompt": [5, 6, 7], "max_tokens": 30, "ignore_eos": True})
        first = r.readline()
        assert first.startswith(b"data: ")
        d.proc.send_signal(15)
        events = [json.loads(first[6:])] + _events(r)
        assert events[-1] == "[DONE]"
        reasons = [e["choices"][0]["finish_reason"] for e in events[:-1]]
        assert reasons == [None] * 30 + ["length"]              # every token, then the end
        assert d.proc.wait(60) == 0
    finally:
        d.stop()

    d = start(tiny_hybrid_dir, cache, "--api-key", KEY, "--max-context", "1024",
              "--drain-timeout", "0", "--parallel", "1", "--queue-size", "1", "--threads", "1")
    d.headers = {"Authorization": f"Bearer {KEY}"}
    try:
        listed = d.get("/v1/contexts").json["data"]
        assert [(c["name"], c["pinned"], c["tokens"]) for c in listed] == [("kb", True, n_ctx)]
        out = d.post("/v1/completions", {"context": "kb", "prompt": " state", "max_tokens": 2})
        assert out.status == 200, out.text
        assert out.json["usage"]["prompt_tokens_details"]["cached_tokens"] >= n_ctx
        assert out.json["timings"]["cache_tier"] == "disk"     # restored after the restart

        # one running, one waiting: a third request finds the queue full
        r = _open_stream(d, {"prompt": [5, 6, 7], "max_tokens": 900, "ignore_eos": True})
        assert r.readline().startswith(b"data: ")
        got: list = []
        reader = threading.Thread(target=lambda: got.extend(_events(r)))
        reader.start()
        waiting: list = []
        queued = threading.Thread(target=lambda: waiting.append(
            d.post("/v1/completions", {"prompt": [9, 9], "max_tokens": 2})))
        queued.start()
        while d.get("/health").json["waiting"] == 0:
            time.sleep(0.02)
        full = d.post("/v1/completions", {"prompt": [8, 8], "max_tokens": 2})
        assert full.status == 503 and full.json["error"]["code"] == "queue_full"
        assert full.headers["Retry-After"] == "1"

        # SIGTERM with no time to drain: running and queued work is cancelled, still exit 0
        d.proc.send_signal(15)
        assert d.proc.wait(60) == 0, d.output()
        reader.join(10)
        queued.join(10)
        errors = [e for e in got if isinstance(e, dict) and "error" in e]
        assert errors and errors[0]["error"]["code"] == "cancelled"
        assert waiting[0].status == 503 and waiting[0].json["error"]["code"] == "cancelled"
        assert "stopped" in d.output() and "1 torch threads" in d.output()
    finally:
        d.stop()


def _serve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptd.tools.cli", "serve", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_bad_flags_exit_2_with_one_line(tmp_path):
    r = _serve("--port", "eighty", "--cache-dir", str(tmp_path))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "--port" in r.stderr
    r = _serve("--cache-dir", str(tmp_path), env={"CKPTD_BLOCK_SIZE": "16",
                                                  "CKPTD_SNAPSHOT_INTERVAL": "20"})
    assert r.returncode == 2 and "snapshot_interval" in r.stderr, r.stderr
    r = _serve("--disk-budget", "lots", "--cache-dir", str(tmp_path))
    assert r.returncode == 2 and "--disk-budget" in r.stderr, r.stderr


def test_a_request_past_its_time_limit_gets_504_and_the_daemon_goes_on(tiny_hybrid_dir,
                                                                      tmp_path):
    """No limit by default (a cold long prompt on a CPU takes many minutes); with
    --request-timeout, a generation past it ends with a 504 naming the limit."""
    d = start(tiny_hybrid_dir, tmp_path / "cache", "--request-timeout", "0.5")
    try:
        r = d.post("/completion", {"prompt": "hello", "n_predict": 100_000,
                                   "ignore_eos": True}, timeout=60)
        assert r.status == 504, r.text
        assert "time limit (0.5 s)" in r.json["error"]["message"]
        ok = d.post("/completion", {"prompt": "hello", "n_predict": 2})
        assert ok.status == 200, ok.text
    finally:
        assert d.stop() == 0, d.output()
    assert ServeConfig().request_timeout is None

"""Keys and limits: --api-key, --admin-key and --no-admin on a real daemon, --max-tokens,
the warning for a non-loopback bind without a key, and how the settings are read."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import pytest

from ckptd.daemon import config, flags
from tests.daemon.daemon_proc import ROOT, Daemon, start
from tests.reliability.conftest import ARGS, ENV

KEY, ADMIN = "user-key", "admin-key"


def _cfg(argv: list[str], env: dict | None = None) -> config.ServeConfig:
    p = argparse.ArgumentParser()
    flags.add_arguments(p)
    return flags.from_args(p.parse_args(argv), env or {})


def test_settings_for_admin_and_limits(tmp_path):
    assert _cfg(["--no-admin"]).no_admin is True
    assert _cfg([], {"CKPTD_NO_ADMIN": "1"}).no_admin is True
    assert _cfg([], {"CKPTD_NO_ADMIN": "false"}).no_admin is False
    assert _cfg([], {"CKPTD_ADMIN_KEY": "k"}).admin_key == "k"
    assert _cfg(["--max-tokens", "64"]).max_tokens == 64
    for argv, env, word in [([], {"CKPTD_NO_ADMIN": "maybe"}, "--no-admin"),
                            (["--no-admin", "--admin-key", "k"], {}, "not both"),
                            (["--max-tokens", "0"], {}, "max_tokens"),
                            (["--admin-key", " k"], {}, "admin_key")]:
        with pytest.raises(ValueError, match=word):
            _cfg(argv, env)
    for host, loop in [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                       ("localhost", True), ("0.0.0.0", False), ("10.1.2.3", False)]:
        assert config.ServeConfig(host=host, cache_dir=tmp_path).loopback is loop


def _auth(key: str | None) -> dict:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


def test_api_key_admin_key_and_max_tokens(tiny_hybrid_dir, tmp_path):
    d = start(tiny_hybrid_dir, tmp_path / "cache", *ARGS, "--api-key", KEY,
              "--admin-key", ADMIN, "--max-tokens", "4", env=ENV)
    try:
        expect = {  # path: {key given: status}
            "/health": {None: 200, KEY: 200, ADMIN: 200},
            "/v1/models": {None: 401, "wrong": 401, KEY: 200, ADMIN: 200},
            "/cache/stats": {None: 401, "wrong": 401, KEY: 401, ADMIN: 200},
            "/cache/entries": {KEY: 401, ADMIN: 200},
        }
        for path, cases in expect.items():
            for key, status in cases.items():
                assert d.get(path, headers=_auth(key)).status == status, (path, key)
        r = d.post("/cache/clear", {}, headers=_auth(KEY))
        assert r.status == 401 and r.json["error"]["code"] == "invalid_api_key"
        d.headers = _auth(KEY)
        r = d.post("/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 5,
                                       "ignore_eos": True})
        assert r.status == 200 and r.json["usage"]["completion_tokens"] == 4   # clamped
        r = d.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                            "ignore_eos": True})
        assert r.status == 200 and r.json["usage"]["completion_tokens"] == 4   # the cap
        r = d.post("/completion", {"prompt": [5, 6], "n_predict": -1, "ignore_eos": True})
        assert r.status == 200 and r.json["tokens_predicted"] == 4
        # A second daemon on the same folder is refused before it loads anything.
        r = subprocess.run([sys.executable, "-m", "ckptd.tools.cli", "serve", "--port", "0",
                            "--cache-dir", str(tmp_path / "cache")], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "another ckptd serves it" in r.stderr, r.stderr
        assert f"pid {d.proc.pid}" in r.stderr and r.stderr.strip().count("\n") == 0
        doc = d.get("/openapi.json").json
        op = doc["paths"]["/cache/stats"]["get"]
        assert op["security"] == [{"admin": []}] and "403" in op["responses"]
        assert doc["paths"]["/health"]["get"]["security"] == []
    finally:
        assert d.stop() == 0, d.output()


def test_no_admin_and_the_open_bind_warning(tiny_hybrid_dir, tmp_path):
    # Bound to every address without a key: the daemon says so. The test still talks
    # to 127.0.0.1 only.
    d = Daemon(tiny_hybrid_dir, tmp_path / "cache", *ARGS, "--host", "0.0.0.0",
               "--no-admin", env=ENV)
    try:
        d.wait_ready()
        deadline = time.monotonic() + 10
        while "without --api-key" not in d.output() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "without --api-key" in d.output()
        for method, path in [("GET", "/cache/stats"), ("POST", "/cache/clear"),
                             ("DELETE", "/cache/entries/" + "0" * 32)]:
            r = d.request(method, path, {} if method == "POST" else None)
            assert r.status == 403 and r.json["error"]["code"] == "admin_disabled", r.text
        assert d.get("/v1/models").status == 200
    finally:
        assert d.stop() == 0, d.output()

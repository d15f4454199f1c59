"""Tenant isolation: a request with cache_salt A is never served state written under salt
B (or none), learns nothing about B's prompts from cached_tokens or timings, can't read
the cache admin API without the admin key, and can't use or replace B's named context."""

from __future__ import annotations

import random

from tests.daemon.daemon_proc import start
from tests.reliability.conftest import ARGS, ENV, greedy

ADMIN = "admin-secret"
A, B = "tenant-A", "tenant-B"


def _complete(d, prompt: list[int], salt: str | None) -> dict:
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    r = d.post("/v1/completions", body)
    assert r.status == 200, r.text
    return r.json


def test_salts_share_nothing_across_100_prompts(tiny_hybrid_dir, tmp_path):
    d = start(tiny_hybrid_dir, tmp_path / "cache", *ARGS, "--admin-key", ADMIN, env=ENV)
    try:
        rng = random.Random(100)
        prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(34, 60))]
                   for _ in range(100)]
        for p in prompts[:50]:                       # B caches half of them
            greedy(d, p, n=1, salt=B)
        seen = {}
        for i, p in enumerate(prompts):              # A asks all of them
            out = _complete(d, p, A)
            t = out["timings"]
            seen[i < 50] = seen.get(i < 50, set()) | {
                (out["usage"]["prompt_tokens_details"]["cached_tokens"], t["cache_n"],
                 t.get("cache_tier"))}
        # Whether B had the prompt or not, A sees the same: nothing cached.
        assert seen == {True: {(0, 0, None)}, False: {(0, 0, None)}}
        for p in prompts[:20]:                       # nor does a request without a salt
            assert _complete(d, p, None)["timings"]["cache_n"] == 0
        hits = [greedy(d, p, n=1, salt=B)[1] for p in prompts[:10]]
        assert all(h >= 32 for h in hits), hits      # B's state was there all along
        # The admin API, which lists every tenant's entries, needs the admin key.
        assert d.get("/cache/entries").status == 401
        assert d.get("/cache/stats", headers={"Authorization": "Bearer tenant-A"}).status == 401
        assert d.get("/cache/stats", headers={"Authorization": f"Bearer {ADMIN}"}).status == 200
    finally:
        assert d.stop() == 0, d.output()


def test_a_salted_context_belongs_to_its_tenant(tiny_hybrid_dir, tmp_path):
    d = start(tiny_hybrid_dir, tmp_path / "cache", *ARGS, env=ENV)
    try:
        text = "The vault code is 4417. " * 8
        r = d.post("/v1/contexts", {"name": "kb", "text": text, "cache_salt": B})
        assert r.status == 201, r.text
        n_ctx = r.json["tokens"]
        # Listed, shown and deletable for its own salt only; unknown to anyone else.
        assert d.get("/v1/contexts").json["data"] == []
        assert d.get(f"/v1/contexts?cache_salt={A}").json["data"] == []
        listed = d.get(f"/v1/contexts?cache_salt={B}")
        assert B not in listed.text and listed.json["data"][0]["salted"] is True
        for query in ("", f"?cache_salt={A}"):
            assert d.get(f"/v1/contexts/kb{query}").status == 404
            assert d.request("DELETE", f"/v1/contexts/kb{query}").status == 404
        shown = d.get(f"/v1/contexts/kb?cache_salt={B}")
        assert shown.status == 200 and B not in shown.text
        ask = {"prompt": " The code is", "context": "kb", "max_tokens": 2}
        for salt in (A, None):                       # as if there were no such context
            r = d.post("/v1/completions", {**ask, **({"cache_salt": salt} if salt else {})})
            assert r.status == 404 and r.json["error"]["code"] == "context_not_found"
        r = d.post("/v1/completions", {**ask, "cache_salt": B})
        assert r.status == 200, r.text
        assert r.json["usage"]["prompt_tokens_details"]["cached_tokens"] >= n_ctx
        r = d.post("/v1/contexts", {"name": "kb", "text": "poisoned", "cache_salt": A})
        assert r.status == 409 and r.json["error"]["code"] == "context_exists"
        r = d.post("/v1/contexts", {"name": "kb", "text": "poisoned"})
        assert r.status == 409
        assert d.request("DELETE", f"/v1/contexts/kb?cache_salt={B}").status == 200
    finally:
        assert d.stop() == 0, d.output()

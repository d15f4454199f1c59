"""The cache page at / and the read-only JSON it reads (daemon/http/cacheview.py), from a
real daemon with an admin key; and the cache's fields in every response. The page in
a real browser: test_the_page_in_a_browser, below (tools/browser.py)."""

from __future__ import annotations

import re
import time

import pytest

from tests.daemon.daemon_proc import Daemon, start

KEY = "page-admin-key"
DOC = "The quick brown fox jumps over the lazy dog, and the dog sleeps on. " * 12
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def page_daemon(tiny_hybrid_dir, tmp_path_factory):
    d = start(tiny_hybrid_dir, tmp_path_factory.mktemp("page") / "cache", "--admin-key", KEY,
              "--max-context", "16384", "--parallel", "2", "--step-tokens", "8",
              "--snapshot-interval", "256")
    try:
        r = d.post("/v1/contexts", {"name": "handbook", "text": DOC}, headers=AUTH)
        assert r.status == 201, r.text
        for q in ("What does the fox do?", "Where does the dog sleep?"):
            assert d.post("/completion", {"prompt": q, "context": "handbook", "n_predict": 4},
                          headers=AUTH).status == 200
        r = d.post("/completion", {"prompt": DOC + "More.", "n_predict": 2,
                                   "cache_salt": "tenant-b"}, headers=AUTH)
        assert r.json["timings"]["cache"]["miss"]["reason"] == "other_salt", r.json
        yield d
    finally:
        assert d.stop() == 0, d.output()


def steady_tiers(d: Daemon) -> dict:
    """/cache/tiers once the writer is done (two reads a moment apart agree)."""
    last = None
    for _ in range(100):
        now = d.get("/cache/tiers", headers=AUTH).json["now"]["tiers"]
        if now == last:
            return now
        last = now
        time.sleep(0.2)
    raise AssertionError("the tiers never held still")


def test_the_page_is_served_without_a_key_and_its_data_is_not(page_daemon):
    d = page_daemon
    r = d.get("/")
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
    assert '<script src="/page.js"></script>' in r.text
    assert "script-src 'self'" in r.headers["Content-Security-Policy"]
    js = d.get("/page.js")
    assert js.status == 200 and "text/javascript" in js.headers["Content-Type"]
    assert "/cache/tiers" in js.text and "Authorization" in js.text
    for path in ("/cache/tiers", "/cache/tree", "/cache/requests", "/cache/misses",
                 "/cache/pinned"):
        assert d.get(path).status == 401, path
        assert d.get(path, headers=AUTH).status == 200, path


def test_the_views_report_what_the_cache_holds(page_daemon):
    d = page_daemon
    tiers = steady_tiers(d)
    stats = d.get("/cache/stats", headers=AUTH).json
    assert tiers["disk"]["entries"] == stats["disk"]["entries"] > 0
    assert tiers["disk"]["bytes"] == stats["disk"]["stored_bytes"]
    assert tiers["host"]["bytes"] == stats["host"]["bytes"]
    body = d.get("/cache/tiers", headers=AUTH).json
    assert body["server"]["block_size"] == 16 and body["server"]["hybrid"] is True
    assert body["history"] and body["history"][0]["t"] <= body["now"]["t"]
    assert body["now"]["prompt_tokens"] >= body["now"]["cached_tokens"] > 0

    tree = d.get("/cache/tree", headers=AUTH).json
    assert tree["entries"] == stats["entries"]
    roots = [n for n in tree["nodes"] if n["kind"] == "root"]
    assert len(roots) == 2                              # no salt, and tenant-b's
    ctx = d.get("/v1/contexts/handbook", headers=AUTH).json
    runs = [n for n in tree["nodes"] if n["kind"] == "blocks" and n["start"] == 0]
    assert any(n["end"] >= ctx["tokens"] // 16 * 16 for n in runs)
    biggest = max(runs, key=lambda n: n["subtree_bytes"])
    assert set(biggest["tiers"]) <= {"device", "host", "disk"} and biggest["tiers"]["disk"]
    assert biggest["preview"].startswith("The quick brown fox")

    pinned = d.get("/cache/pinned", headers=AUTH).json
    (row,) = [c for c in pinned["contexts"] if c["name"] == "handbook"]
    assert row["cached"] and row["pinned"] and row["key"] == ctx["key"]
    (prefix,) = [p for p in pinned["prefixes"] if "handbook" in p["contexts"]]
    assert prefix["position"] == ctx["tokens"] and "lazy dog" in prefix["text"]

    misses = d.get("/cache/misses", headers=AUTH).json
    assert misses["by_reason"]["other_salt"] == 1 and misses["restores"] >= 4
    assert misses["recent"][0]["miss"]["reason"] == "other_salt"
    metrics = d.get("/metrics", headers=AUTH).text
    assert 'ckptd_cache_misses_total{reason="other_salt"} 1' in metrics
    assert re.search(r'ckptd_cache_missed_tokens_total\{reason="other_salt"\} [1-9]', metrics)


def test_every_response_says_why_it_missed(page_daemon):
    d = page_daemon
    q = {"prompt": "Tell me about the dog.", "context": "handbook"}
    r = d.post("/completion", {**q, "n_predict": 2}, headers=AUTH).json
    cache = r["timings"]["cache"]
    assert cache["restored"] == r["timings"]["cache_n"] > 0
    assert sum(cache["tiers"].values()) == cache["restored"]
    assert cache["runs"][0]["start"] == 0 and cache["runs"][-1]["end"] == cache["restored"]
    assert cache["miss"]["position"] == cache["restored"] and cache["miss"]["detail"]
    again = d.post("/completion", {**q, "n_predict": 2}, headers=AUTH).json
    assert again["timings"]["cache"]["miss"] is None            # an exact repeat
    r = d.post("/v1/completions", {**q, "max_tokens": 2}, headers=AUTH).json
    details = r["usage"]["prompt_tokens_details"]
    assert details["cache_miss"] is None and details["cached_tokens"] > 0
    assert sum(details["cached_tokens_by_tier"].values()) == details["cached_tokens"]
    chat = d.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                          "max_tokens": 2, "cache": False},
                  headers=AUTH).json
    assert chat["usage"]["prompt_tokens_details"]["cache_miss"]["reason"] == "disabled"
    assert chat["timings"]["cache"]["miss"]["reason"] == "disabled"
    # and the log: one line per restore
    assert re.search(r"INFO ckptd\.cache: cache #\d+: [\d,]+ / [\d,]+ tokens restored",
                     d.output())


TIERS_JS = """JSON.stringify(Object.fromEntries([...document.querySelectorAll('[data-tier]')]
  .map(el => [el.dataset.tier, [Number(el.dataset.bytes), Number(el.dataset.entries)]])))"""
TREE_JS = """JSON.stringify([...document.querySelectorAll('[data-node]')]
  .map(el => [el.dataset.node, el.dataset.kind, el.dataset.start || null]))"""
LIVE_JS = """(() => { const r = document.querySelector('[data-request][data-state=prefill]');
  return r ? [Number(r.dataset.computed), Number(r.dataset.prompt), r.innerText] : null; })()"""


async def test_the_page_in_a_browser(page_daemon):
    """Headless Chromium loads / from the daemon: it asks for the admin key, then draws
    the tiers and the tree with the daemon's numbers, and a running prefill's progress
    moves."""
    import asyncio
    import json

    import aiohttp

    from ckptd.tools.browser import Chromium

    d = page_daemon
    async with Chromium(width=1440, height=1000) as page:
        await page.goto(d.url + "/")
        await page.wait_for("document.getElementById('key-dialog').open")
        await page.eval(f"document.getElementById('key-input').value = {json.dumps(KEY)}")
        await page.eval("document.getElementById('key-form').requestSubmit()")
        await page.wait_for("document.querySelectorAll('[data-node]').length > 0")

        tiers = steady_tiers(d)
        want = {t: [x["bytes"], x["entries"]] for t, x in tiers.items()}
        deadline = time.monotonic() + 30            # the page polls the tiers every 5 s
        while json.loads(await page.eval(TIERS_JS)) != want:
            assert time.monotonic() < deadline, (await page.eval(TIERS_JS), want)
            await asyncio.sleep(0.5)
        text = await page.eval("document.querySelector('[data-tier=disk]').innerText")
        assert f"{tiers['disk']['entries']:,}" in text

        tree = d.get("/cache/tree?limit=24", headers=AUTH).json["nodes"]
        want = [[n["id"], n["kind"], None if n["kind"] == "root"
                 else str(n.get("start", n.get("position")))] for n in tree]
        deadline = time.monotonic() + 30            # the page polls the tree every 10 s
        while json.loads(await page.eval(TREE_JS)) != want:
            assert time.monotonic() < deadline, (await page.eval(TREE_JS), want)
            await asyncio.sleep(0.5)
        assert await page.eval("document.querySelector('[data-context=handbook]') !== null")
        assert await page.eval("document.querySelector('[data-miss=other_salt]') !== null")

        # a long prefill, streamed: its row's progress moves, then the client goes away
        prompt = [(i * 7919) % 400 + 3 for i in range(15000)]
        seen: list[int] = []
        async with aiohttp.ClientSession(headers=AUTH) as http:
            resp = await http.post(d.url + "/completion", json={
                "prompt": prompt, "n_predict": 1, "stream": True, "cache_prompt": False})
            try:
                deadline = time.monotonic() + 120
                while len(set(seen)) < 3:
                    assert time.monotonic() < deadline, seen
                    row = await page.eval(LIVE_JS)
                    if row is not None:
                        computed, total, text = row
                        assert total == len(prompt) and "disabled" in text
                        assert re.search(r"\d tok/s", text), text       # rate and ETA
                        seen.append(computed)
                    await asyncio.sleep(0.1)
            finally:
                resp.close()                       # cancels the request
        assert seen == sorted(seen) and 0 <= seen[0] < seen[-1] < len(prompt)
        await page.wait_for("document.querySelector('[data-request]') === null", 60)
        assert page.errors == [] and not [c for c in page.console if c.startswith("error")]


def test_without_keys_the_views_answer_everyone(daemon):
    """The shared daemon of tests/daemon/conftest.py has no key: nothing to ask for."""
    assert daemon.get("/").status == 200
    for path in ("/cache/tiers", "/cache/tree", "/cache/requests", "/cache/misses",
                 "/cache/pinned"):
        assert daemon.get(path).status == 200, path
    assert daemon.get("/cache/tree?limit=0").status == 400          # limit: 1..500

"""Many clients at once on a real daemon: continuous batching, chunked prefill, cancellation."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import time

import aiohttp
import pytest

from tests.daemon.daemon_proc import start

PREFIX = list(range(3, 3 + 90))             # shared by every client: several full blocks


@pytest.fixture(scope="module")
def busy(tiny_hybrid_dir, tmp_path_factory):
    d = start(tiny_hybrid_dir, tmp_path_factory.mktemp("busy") / "cache",
              "--max-context", "2048", "--parallel", "16", "--step-tokens", "16",
              "--snapshot-interval", "64", "--request-timeout", "120")
    yield d
    assert d.stop() == 0, d.output()


async def _stream(session: aiohttp.ClientSession, url: str, body: dict,
                  t0: float) -> tuple[list[int], list[dict], float]:
    """POST /completion with stream: (generated ids, events, seconds to the first token)."""
    tokens, events, first = [], [], None
    async with session.post(url + "/completion", json={**body, "stream": True}) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.startswith(b"data: "):
                continue
            ev = json.loads(line[6:])
            events.append(ev)
            if ev["tokens"] and first is None:
                first = time.perf_counter() - t0
            tokens += ev["tokens"]
    return tokens, events, first


def _greedy(prompt: list[int], n: int, **kw) -> dict:
    return {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True,
            "return_tokens": True, **kw}


def _together(busy, prompts: list[list[int]], n: int) -> list:
    """Stream every prompt at once (n greedy tokens each): _stream's result per prompt."""
    async def run():
        t0 = time.perf_counter()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
            return await asyncio.gather(*[_stream(s, busy.url, _greedy(p, n), t0)
                                          for p in prompts])
    return asyncio.run(run())


def _uncached(busy, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Each prompt's n greedy tokens, one request at a time, cache off."""
    return [busy.post("/completion", _greedy(p, n, cache_prompt=False)).json["tokens"]
            for p in prompts]


def test_sixteen_streams_equal_one_by_one(busy):
    prompts = [PREFIX + [300 + i, 7, 301 + i] for i in range(16)]
    streamed = _together(busy, prompts, 6)
    for tokens, events, _ in streamed:
        assert len(tokens) == 6                       # a complete stream
        assert events[-1]["stop"] is True and events[-1]["stop_type"] == "limit"
    one_by_one = _uncached(busy, prompts, 6)
    assert [s[0] for s in streamed] == one_by_one
    assert len({tuple(t) for t in one_by_one}) > 1    # the suffixes matter


def test_short_request_overtakes_a_long_prefill(busy):
    long_prompt = [(11 * i) % 400 + 20 for i in range(1800)]

    async def race():
        t0 = time.perf_counter()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
            long = asyncio.ensure_future(_stream(
                s, busy.url, _greedy(long_prompt, 2, cache_prompt=False), t0))
            while busy.get("/health").json["running"] == 0:      # the long prefill started
                await asyncio.sleep(0.02)
            short = await _stream(s, busy.url, _greedy([5, 6, 7, 8], 2, cache_prompt=False),
                                  t0)
            return await long, short
    (long_tokens, long_events, long_first), (short_tokens, _, short_first) = asyncio.run(race())
    assert len(long_tokens) == 2 and len(short_tokens) == 2
    assert long_events[-1]["timings"]["prompt_ms"] > 300      # the prefill took a while
    assert short_first < long_first, (short_first, long_first)


def _counter(busy, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", busy.get("/metrics").text, re.M)
    return float(m.group(1))


def test_client_disconnect_cancels_its_sequence(busy):
    before = _counter(busy, "ckptd_requests_cancelled_total")
    generated = _counter(busy, "ckptd_generated_tokens_total")
    conn = http.client.HTTPConnection("127.0.0.1", busy.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(
        {"prompt": PREFIX, "max_tokens": 1500, "stream": True, "ignore_eos": True,
         "cache": False}), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    assert r.readline().startswith(b"data: ")          # generating
    conn.close()                                       # the client goes away
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if _counter(busy, "ckptd_requests_cancelled_total") > before and \
                busy.get("/health").json["running"] == 0:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the sequence of a disconnected client kept running")
    assert _counter(busy, "ckptd_generated_tokens_total") - generated < 1500   # stopped early


def test_requests_sharing_an_uncached_prefix_compute_it_once(busy):
    doc = [(13 * i) % 350 + 40 for i in range(700)]        # seen by no other test
    prompts = [doc + [490 + i, 9, 500 + i] for i in range(4)]
    streamed = _together(busy, prompts, 4)
    computed = [ev[-1]["timings"]["prompt_n"] - ev[-1]["timings"]["cache_n"]
                for _, ev, _ in streamed]
    # one request computes the document; the others wait for its pages and compute at
    # most a snapshot interval (64) plus their own suffix
    assert sorted(computed)[-1] >= len(doc)
    assert all(n <= 64 + 3 for n in sorted(computed)[:-1]), computed
    assert [s[0] for s in streamed] == _uncached(busy, prompts, 4)

"""Restores from the remote tier through the cache manager, over a real runner, store
and S3 server (SeaweedFS): the logits after a remote restore are the uncached ones
(both model kinds), and the planner takes the remote only when it is cheaper than
recomputing and worth asking."""

from __future__ import annotations

import pytest
import torch

from ckptd.cache.manager import CacheManager
from ckptd.cache.remote.client import RemoteConfig
from ckptd.cache.remote.layout import RemoteURL
from ckptd.cache.remote.tier import RemoteTier
from ckptd.cache.store import CacheStore
from ckptd.cache.work import Work
from ckptd.model.runner import Runner
from ckptd.model.testing import prompt_logits
from tests.s3 import fresh_url

B = 16


@pytest.fixture
def daemons(tiny_model, tmp_path, s3_server, monkeypatch):
    """daemons(n) -> n (runner, cache) pairs with their own stores and one remote."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    url, made = fresh_url(), []

    def build(n: int):
        out = []
        for _ in range(n):
            runner = Runner(tiny_model, 64, 2, B)
            # The lookup's 2 s deadline is a daemon's; a 2-core machine under a team's
            # load has missed it (a recompute, not the restore these tests check).
            remote = RemoteTier(RemoteConfig(RemoteURL.parse(url), lookup_timeout=30.0),
                                tiny_model.fingerprint, runner.spec)
            store = CacheStore(tmp_path / f"s{len(made)}", runner.spec, tiny_model.fingerprint,
                               remote=remote)
            cache = CacheManager(runner, runner.spec, 64, tiny_model.fingerprint, store,
                                 snapshot_interval=4 * B)
            made.append(cache)
            out.append((runner, cache))
        return out
    yield build
    for cache in made:
        cache.sanity_check()
        cache.close()


def _prefill(runner, cache, tokens: list[int]):
    """Start a sequence, compute its prompt in one step, finish it; its restore info."""
    seq, info = cache.start(tokens)
    n = len(tokens) - seq.num_computed
    if n:
        cache.prepare([(seq, n)])
        out = runner.run([(seq, n)])
        cache.after_step([Work(seq, n)], out)
    logits = out.last(seq) if n else info.logits
    cache.finish(seq)
    return info, logits


def _uploaded(cache) -> None:
    assert cache.store.flush(30) and cache.store.remote.flush(30)


def test_a_remote_restore_gives_the_uncached_logits(tiny_model, daemons):
    (ra, a), (rb, b) = daemons(2)
    tokens = torch.randint(3, 500, (150,), generator=torch.Generator().manual_seed(7)).tolist()
    _prefill(ra, a, tokens)
    _uploaded(a)
    b.rates.prefill_tps = 100.0          # as slow as a real model: the remote pays off
    info, got = _prefill(rb, b, tokens + [9, 10, 11])
    assert info.tier == "remote" and info.cached_tokens >= 128
    assert info.tokens_by_tier() == {"remote": info.cached_tokens}
    # its ranges started when the finder read the head, and the load took them over
    assert b.store.remote.fetcher.stats()["early"] == 1
    want = prompt_logits(tiny_model, tokens + [9, 10, 11])[-1]
    assert (got - want).abs().max().item() <= 1e-5
    # An exact repeat on a third: the stored logits, nothing computed.
    (rc, c), = daemons(1)
    c.rates.prefill_tps = 100.0
    info, got = _prefill(rc, c, tokens)
    assert info.cached_tokens == len(tokens) and info.tier == "remote"
    assert (got - prompt_logits(tiny_model, tokens)[-1]).abs().max().item() <= 1e-5


def test_a_checkpoint_after_a_remote_restore_puts_only_the_new_blocks(daemons):
    """The restored blocks count as stored (the write-through keeps them): the end
    checkpoint reads back and puts only the blocks after them, and goes into the store
    behind the write-through, so its snapshot's parents are there: the whole answer
    restores from the store alone afterwards."""
    (ra, a), (rb, b) = daemons(2)
    tokens = torch.randint(3, 500, (150,), generator=torch.Generator().manual_seed(9)).tolist()
    _prefill(ra, a, tokens)
    _uploaded(a)
    b.rates.prefill_tps = 100.0
    read = []
    real = rb.read_pages

    def counted(pages):
        read.append(len(pages))
        return real(pages)
    rb.read_pages = counted
    longer = tokens + list(range(20, 60))                # 190 tokens: 2 new full blocks
    info, _ = _prefill(rb, b, longer)
    assert info.tier == "remote" and info.cached_tokens >= 144
    assert max(read) <= len(longer) // B - info.cached_tokens // B
    assert b.store.flush(30)
    keys = b.store.chain(longer).keys
    assert all(b.store.has(k) for k in keys[:len(longer) // B])
    plan = b.store.lookup(longer)                        # the local tiers alone
    assert plan.position == len(longer) and plan.tier in ("host", "disk")


def test_the_remote_is_taken_on_cost_and_asked_on_expectation(daemons):
    (ra, a), (rb, b) = daemons(2)
    tokens = torch.randint(3, 500, (150,), generator=torch.Generator().manual_seed(8)).tolist()
    _prefill(ra, a, tokens)
    _uploaded(a)
    remote = b.store.remote
    # Reading would cost more than computing: asked, not taken.
    b.rates.prefill_tps, b.rates.bytes_per_s["remote"] = 100.0, 1.0
    info, _ = _prefill(rb, b, tokens)
    assert info.cached_tokens == 0 and remote.finder.lookups == 1
    assert remote.fetcher.restores == 0
    # the ranges the finder started were stopped, not left running
    assert remote.fetcher.stats()["unused"] == 1 and not remote.fetcher.waiting
    # Asking can't pay off (prefill is nearly free): not even asked.
    (rc, c), = daemons(1)
    c.rates.prefill_tps = 1e12
    info, _ = _prefill(rc, c, tokens)
    assert info.cached_tokens == 0 and c.store.remote.finder.lookups == 0
    # Misses make asking rarer, down to a floor; one hit makes it likelier again.
    (rd, d), = daemons(1)
    d.rates.prefill_tps = 100.0          # every fresh prompt worth asking for at first
    for seed in range(100, 110):        # prompts that start like nothing uploaded
        fresh = torch.randint(3, 500, (100,), generator=torch.Generator().manual_seed(seed))
        _prefill(rd, d, fresh.tolist())
    assert d.rates.remote_hit == pytest.approx(0.107, abs=0.01)
    info, _ = _prefill(rd, d, tokens)
    assert info.tier == "remote" and d.rates.remote_hit > 0.2


def test_a_remote_read_is_priced_by_its_request_rounds_and_bytes():
    """Rates: a remote read costs its rounds of requests (each a measured round trip)
    plus its bytes over the measured bandwidth; a fetch's time less its round trips
    is what updates the bandwidth."""
    from ckptd.cache.entry import BLOCK
    from ckptd.cache.lookup import REMOTE, PieceRef, RestorePlan
    from ckptd.cache.remote.client import RemoteConfig
    from ckptd.cache.remote.fetch import Fetcher
    from ckptd.cache.remote.finder import Found
    from ckptd.cache.remote.layout import RemoteURL
    from ckptd.cache.remote.ranges import Loc
    from ckptd.cache.restorer import Rates

    class Client:                              # what the fetcher's planning reads
        config = RemoteConfig(RemoteURL.parse("s3://bucket"), concurrency=4,
                              range_bytes=4 << 20)
    found = Found(fetcher=Fetcher(Client()))
    pieces = []
    for i in range(50):                        # 50 MB of 1 MB values in one segment
        key = bytes([i]) * 16
        found.where[key] = Loc("seg", i << 20, 1 << 20, 50 << 20)
        pieces.append(PieceRef(key, BLOCK, REMOTE, 1 << 20, 16 * (i + 1)))
    plan = RestorePlan(800, pieces, None, remote=found)
    assert found.rounds(pieces) == 4           # 13 ranged GETs of 4 MB, 4 at a time
    rates = Rates()
    rates.remote_latency, rates.bytes_per_s["remote"] = 0.02, 1e8
    assert rates.read_seconds(plan) == pytest.approx(4 * 0.02 + (50 << 20) / 1e8)
    rates.remote_latency = 0.5                 # a far remote: its round trips dominate
    assert rates.read_seconds(plan) == pytest.approx(4 * 0.5 + (50 << 20) / 1e8)
    rates.remote_latency = 0.02
    rates.update_remote(4, 50_000_000, 0.58)   # 0.08 s of round trips, 0.5 s of bytes
    assert rates.bytes_per_s["remote"] == pytest.approx(0.8 * 1e8 + 0.2 * 1e8)

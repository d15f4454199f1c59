"""Why a request missed the cache (cache/why/): each reason reported for a request made
to miss in that way, through the engine over a real store (the report is what
timings.cache carries), and the answer always the uncached one."""

from __future__ import annotations

import threading

import pytest
import torch

from ckptd.daemon.request import Finished, Request
from ckptd.model.loader import load_model
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.text.tokenizer import Tokenizer
from tests.cache.conftest import flip_value
from tests.daemon.engines import Client
from tests.daemon.engines import make_engine as _make

B = 16


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    return load_model(tiny_llama_dir), Tokenizer.from_dir(tiny_llama_dir)


@pytest.fixture(scope="module")
def hybrid(tiny_hybrid_dir):
    return load_model(tiny_hybrid_dir), Tokenizer.from_dir(tiny_hybrid_dir)


def make(pair, path, **kw):
    model, tok = pair
    kw.setdefault("step_tokens", 64)
    return _make(model, tok, path, block_size=B, **kw)


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 400, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def ask(client: Client, prompt: list[int], salt=None):
    """(tokens, timings.cache) of one request; its checkpoints on disk after it."""
    res = client.submit(prompt, salt=salt).wait()
    client.engine.cache.store.flush()
    return res.tokens, res.fin.stats.timings()["cache"]


def uncached(pair, prompt: list[int]) -> list[int]:
    client = Client(make(pair, None))
    try:
        return client.submit(prompt, use_cache=False).wait().tokens
    finally:
        client.close()


def _miss(report: dict) -> dict:
    miss = report["miss"]
    assert miss is not None, report
    assert miss["position"] == report["restored"]
    assert sum(report["tiers"].values()) == report["restored"]
    return miss


def test_a_new_prompt_is_unseen_and_its_repeat_misses_nothing(hybrid, tmp_path):
    client = Client(make(hybrid, tmp_path))
    a = _prompt(100, 1)
    _, first = ask(client, a)
    assert first["restored"] == 0 and _miss(first)["reason"] == "unseen"
    _, again = ask(client, a)
    assert again["restored"] >= len(a) - 1 and again["miss"] is None
    assert again["runs"][0]["start"] == 0 and again["runs"][-1]["end"] == again["restored"]
    stats = client.engine.cache.store.stats()["misses"]
    assert stats["by_reason"]["unseen"] == 1 and stats["complete"] == 1


def test_evicted_from_disk(llama, tmp_path):
    a, b = _prompt(160, 2), _prompt(160, 3)
    want = uncached(llama, a)
    probe = Client(make(llama, tmp_path / "probe", host_budget=0))
    ask(probe, a)
    size = probe.engine.cache.store.stats()["disk"]["stored_bytes"]
    probe.close()
    # room for one and a half prompts: b's entries evict a's least recently used ones
    client = Client(make(llama, tmp_path / "store", host_budget=0, disk_budget=size * 3 // 2))
    device = client.engine.cache.device
    ask(client, a)
    device.evict_cached()              # so the store is all there is (it holds them: no record)
    ask(client, b)
    device.evict_cached()
    tokens, report = ask(client, a)
    miss = _miss(report)
    assert miss["reason"] == "evicted" and miss["tier"] == "disk", miss
    assert 0 <= miss["ago_s"] < 120 and miss["at"] is not None
    assert "evicted from disk" in miss["detail"]
    assert report["restored"] < len(a) - 1 and tokens == want
    # the disk evicts a's blocks again while the device still holds them: the device's
    # eviction is the last, and the disk's is said beside it
    ask(client, b)
    device.evict_cached()
    tokens, report = ask(client, a)
    miss = _miss(report)
    assert (miss["reason"], miss["tier"]) == ("evicted", "device"), miss
    assert "its stored copy was evicted from disk" in miss["detail"] and tokens == want


def test_thinned_snapshot_restores_the_one_before(hybrid, tmp_path):
    client = Client(make(hybrid, tmp_path, interval=32, max_snapshots=3,
                         snapshot_budget=1000.0))
    a = _prompt(320, 4)
    ask(client, a)
    gone = client.engine.cache.store.gone
    thinned = sorted(r.position for hist in gone.records.values() for r in hist
                     if r.reason == "thinned")
    assert thinned, "a 320-token prefill at interval 32 keeping 3 snapshots thins some"
    X = thinned[-1]
    suffix = [t + 1 if t + 1 != a[X] else t + 2 for t in _prompt(24, 5)]
    q = a[:X] + suffix
    tokens, report = ask(client, q)
    miss = _miss(report)
    assert miss["reason"] == "thinned" and miss["recomputed"] == X - report["restored"] > 0
    assert f"snapshot at {X:,}" in miss["detail"]
    assert tokens == uncached(hybrid, q)


def test_other_salt(llama, tmp_path):
    client = Client(make(llama, tmp_path))
    a = _prompt(80, 6)
    ask(client, a, salt="alice")
    for salt in ("bob", None):
        _, report = ask(client, a, salt=salt)
        assert report["restored"] == 0 and _miss(report)["reason"] == "other_salt", salt
    # a salt's own prefix restores
    _, report = ask(client, a, salt="alice")
    assert report["miss"] is None
    # the deepest block another salt's entries share with the prompt is said, not the first
    for shared, salt in ((3, "carol"), (1, "dave")):      # salts with nothing of their own
        q = a[:shared * B] + [t + 1 for t in a[shared * B:]]
        _, report = ask(client, q, salt=salt)
        miss = _miss(report)
        assert (miss["reason"], miss["recomputed"]) == ("other_salt", shared * B), miss
        assert f"its first {shared * B} tokens are cached under another" in miss["detail"]


def test_other_model_fingerprint(llama, hybrid, tmp_path):
    a = _prompt(80, 7)
    first = make(llama, tmp_path)
    client = Client(first)
    ask(client, a)
    client.close()
    first.cache.close()
    client = Client(make(hybrid, tmp_path))       # the same folder, another model
    _, report = ask(client, a)
    miss = _miss(report)
    assert miss["reason"] == "other_model" and llama[0].fingerprint[:12] in miss["detail"]


def test_corrupt_entry_fails_the_restore_then_is_reported_dropped(llama, tmp_path):
    a = _prompt(100, 8)
    want = uncached(llama, a)
    first = make(llama, tmp_path)
    client = Client(first)
    ask(client, a)
    bad = first.cache.store.lookup(a).blocks[2].key
    client.close()
    first.cache.close()
    flip_value(tmp_path, b"blocks", bad)
    client = Client(make(llama, tmp_path))         # a restart: the blocks come from disk
    tokens, report = ask(client, a)
    miss = _miss(report)
    assert miss["reason"] == "corrupt" and miss["tier"] == "disk"
    # planned: the whole prompt (its end snapshot holds the last logits)
    assert report["restored"] == 2 * B and miss["recomputed"] == len(a) - 2 * B
    assert "failed verification" in miss["detail"] and tokens == want
    # dropped (its departure recorded), computed again and stored: the next one restores
    assert client.engine.cache.store.gone.get(bad).reason == "corrupt"
    tokens, report = ask(client, a)
    assert report["miss"] is None and tokens == want


def test_budget_refused_the_write(llama, tmp_path):
    client = Client(make(llama, tmp_path, host_budget=0, disk_budget=1))
    a = _prompt(80, 9)
    ask(client, a)
    client.engine.cache.device.evict_cached()
    tokens, report = ask(client, a)
    miss = _miss(report)
    assert report["restored"] == 0 and miss["reason"] == "budget" and miss["tier"] == "disk"
    assert "disk budget" in miss["detail"]
    stats = client.engine.cache.store.stats()
    assert stats["misses"]["by_reason"]["budget"] == 1
    assert stats["write_queue"]["lost_no_room"] > 0


def test_cheaper_to_compute(llama, tmp_path):
    client = Client(make(llama, tmp_path, host_budget=0))
    a = _prompt(96, 10)
    ask(client, a)
    client.engine.cache.device.evict_cached()
    client.engine.cache.rates.bytes_per_s["disk"] = 1.0     # a disk slower than the model
    _, report = ask(client, a)
    miss = _miss(report)
    assert report["restored"] == 0 and miss["reason"] == "cost" and miss["tier"] == "disk"
    assert miss["recomputed"] == len(a)        # the exact repeat: its end snapshot too


def test_deleted_by_the_admin_api(llama, tmp_path):
    client = Client(make(llama, tmp_path))
    a = _prompt(64, 11)
    ask(client, a)
    store = client.engine.cache.store
    first_block = store.lookup(a).blocks[0].key.hex()
    client.engine.cache.device.evict_cached()      # first: the delete is the last departure
    assert store.delete(first_block) > 0
    _, report = ask(client, a)
    assert report["restored"] == 0 and _miss(report)["reason"] == "deleted"


def test_departures_survive_a_restart(llama, tmp_path):
    a, b = _prompt(160, 12), _prompt(160, 13)
    client = Client(make(llama, tmp_path, host_budget=0, disk_budget=1))
    ask(client, a)
    client.close()
    client.engine.cache.close()
    client = Client(make(llama, tmp_path, host_budget=0))
    _, report = ask(client, a)
    assert _miss(report)["reason"] == "budget"
    _, report = ask(client, b)
    assert _miss(report)["reason"] == "unseen"


def _timed_out(client: Client, prompt: list[int]) -> None:
    """A request whose time runs out after its first step (64 tokens): an errored
    request stores no checkpoint, so the pages it computed are on the device only."""
    done, finished = threading.Event(), []

    def emit(ev):
        if isinstance(ev, Finished):
            finished.append(ev)
            done.set()
    client.engine.submit(Request(list(prompt), SamplingParams(max_tokens=4, ignore_eos=True),
                                 emit, timeout_s=1e-6))
    assert done.wait(120) and finished[0].reason == "error"
    cache = client.engine.cache
    keys = cache.chain(prompt, None).keys
    assert cache.device.holds(keys[:4]) == [True] * 4
    assert not any(cache.store.has(k) for k in keys)


def test_evicted_from_the_device_the_only_tier_that_held_it(llama, tmp_path):
    """Pages only the device held, reclaimed for another prompt: the next request for
    that prefix is told so (and when), not that it was never seen."""
    a, b, c = _prompt(160, 14), _prompt(350, 15), _prompt(160, 16)
    want = uncached(llama, a)
    client = Client(make(llama, tmp_path, pages=24))      # 384 tokens of KV
    _timed_out(client, a)
    ask(client, b)                     # 23 pages: the pool takes some of a's back
    tokens, report = ask(client, a)
    miss = _miss(report)
    assert miss["reason"] == "evicted" and miss["tier"] == "device", miss
    assert 0 < report["restored"] < 4 * B and report["tiers"] == {"device": report["restored"]}
    assert "evicted from device (least recently used" in miss["detail"]
    assert 0 <= miss["ago_s"] < 120 and tokens == want
    # every cached page forgotten at once (the daemon going to sleep) says why too
    _timed_out(client, c)
    client.engine.cache.device.evict_cached("the daemon went to sleep (model unloaded)")
    _, report = ask(client, c)
    miss = _miss(report)
    assert report["restored"] == 0 and (miss["reason"], miss["tier"]) == ("evicted", "device")
    assert "went to sleep" in miss["detail"]
    # a block the store holds too left the device, not the cache: no record of it
    gone = client.engine.cache.store.gone
    assert not any(gone.get(k) for k in client.engine.cache.chain(b, None).keys)

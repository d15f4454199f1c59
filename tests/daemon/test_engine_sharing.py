"""Device prefix sharing, snapshot thinning and long contexts, through the engine and the
scheduler with a real store. Outputs are always compared with an uncached run."""

from __future__ import annotations

import pytest
import torch

from ckptd.cache.keys import block_keys
from ckptd.cache.store import CacheStore
from ckptd.cache.work import Work
from ckptd.daemon.engine import Engine
from ckptd.model.loader import load_model
from ckptd.model.text.tokenizer import Tokenizer
from tests.daemon.engines import Client, Result
from tests.daemon.engines import make_engine as _make

B = 16
LONG_PREFIX = 8192      # the size; a tiny model prefills it in a few seconds


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def make_engine(model, tok, path, pages=256, slots=4, interval=32, max_snapshots=16,
                step_tokens=512, **store_options) -> Engine:
    return _make(model, tok, path, block_size=B, pages=pages, slots=slots, interval=interval,
                 max_snapshots=max_snapshots, step_tokens=step_tokens, **store_options)


def _uncached(model, tok, prompts, max_tokens=6) -> list[list[int]]:
    client = Client(make_engine(model, tok, None))
    out = [r.tokens for r in client.run(prompts, max_tokens=max_tokens, use_cache=False)]
    client.close()
    return out


def _page_probe(eng: Engine) -> dict:
    """Page bookkeeping while the running sequences all decode."""
    device, running = eng.cache.device, eng.scheduler.running
    return {"pages": [list(live.seq.pages) for live in running],
            "refs": list(device.refs), "free": device.num_free,
            "decoding": all(live.t_decode for live in running)}


def test_device_sharing_equals_uncached(tiny_dir, tiny_model, tmp_path):
    tok = Tokenizer.from_dir(tiny_dir)
    prefix = _prompt(5 * B, 1)                                  # five full pages
    round1 = [prefix + [1, 2, 3], prefix + [4, 5, 6, 7, 8]]
    round2 = [prefix + [9] * 4,                                 # leaves it at a page edge
              round1[0] + [10, 11],                             # extends a prompt
              prefix[:40] + [12] * 7]                           # leaves it mid-page
    want = _uncached(tiny_model, tok, round1 + round2)

    # every interval snapshot (32): the third prompt of round 2 restores from one
    eng = make_engine(tiny_model, tok, tmp_path, snapshot_budget=1000.0)
    client = Client(eng)
    probes = []
    first = [client.submit(p, on_token=lambda r: probes.append(_page_probe(client.engine)))
             for p in round1]
    first = [r.wait() for r in first]
    second = client.run(round2)
    other = client.run([round2[0]], salt="tenant-b")[0]
    client.close()
    eng.cache.close()

    assert [r.tokens for r in first + second] == want
    assert other.tokens == want[2]
    # Sent together, the two prompts hold the prefix once: the second waits for the
    # first's prefill to pass where they part (a branch snapshot there) and adopts it.
    both = [p for p in probes if p["decoding"] and len(p["pages"]) == 2]
    assert both
    a, b = both[-1]["pages"]
    assert a[:5] == b[:5] and all(both[-1]["refs"][p] == 3 for p in a[:5])

    edge = second[0].fin.stats
    if eng.runner.spec.is_hybrid:      # round 1's branch snapshot at 80, from RAM
        assert edge.cache_n == 80 and edge.cache_tier == "host"
    else:               # any block boundary, from the device pages alone
        assert edge.cache_n == 80 and edge.cache_tier == "device"
    assert client.cached_by_tier.get("device", 0) >= 3 * 32
    assert second[2].fin.stats.cache_n >= 32
    assert other.fin.stats.cache_n == 0                         # salts never share a page


def test_long_prefix_is_held_once_while_requests_run(tiny_dir, tiny_model, tmp_path):
    tok = Tokenizer.from_dir(tiny_dir)
    prefix = _prompt(LONG_PREFIX, 3)
    n = LONG_PREFIX // B
    eng = make_engine(tiny_model, tok, tmp_path, pages=n + 32, interval=1024)
    client = Client(eng)
    probes: list[dict] = []
    later: list[Result] = []

    def on_token(res: Result) -> None:
        if len(res.tokens) == 1 and not later:        # A decodes: B and C arrive
            later.extend(client.submit(prefix + [7 + i, 100 + i], max_tokens=4,
                                       on_token=lambda r: probes.append(
                                           _page_probe(client.engine)))
                         for i in range(2))
    a = client.submit(prefix + [5, 6], max_tokens=24, on_token=on_token)
    a.wait()
    for r in later:
        r.wait()
    client.close()
    eng.cache.close()

    assert a.fin.stats.cache_n == 0
    for r in later:
        assert r.fin.stats.cache_n == LONG_PREFIX
        assert r.fin.stats.cache_tier == ("host" if eng.runner.spec.is_hybrid else "device")
    three = [p for p in probes if p["decoding"] and len(p["pages"]) == 3]
    assert three
    probe = three[-1]
    pa, pb, pc = probe["pages"]
    assert pa[:n] == pb[:n] == pc[:n]
    assert all(probe["refs"][p] == 4 for p in pa[:n])         # A, B, C and the prefix table
    used = len(probe["refs"]) - probe["free"]
    assert used == len(set(pa) | set(pb) | set(pc)) <= n + 3 * 2


def _compute(eng, seq, n):
    """A step of n tokens for seq, as the engine runs it."""
    eng.cache.prepare([(seq, n)])
    out = eng.runner.run([(seq, n)])
    eng.cache.after_step([Work(seq, n)], out)


def test_published_keys_are_the_stores(tiny_dir, tiny_model, tmp_path):
    eng = make_engine(tiny_model, Tokenizer.from_dir(tiny_dir), tmp_path)
    cache = eng.cache
    tokens = _prompt(3 * B + 5, 4)
    seq, _ = cache.start(tokens, "s")
    _compute(eng, seq, len(tokens))                       # the end of the prompt
    seq.tokens += _prompt(2 * B, 5)                       # generated tokens, computed later
    _compute(eng, seq, 2 * B)
    cache.finish(seq)
    cache.store_pending()
    want = block_keys(cache.store.root("s"), seq.tokens, B)
    assert cache.device.find(cache.chain(seq.tokens, "s")) == seq_pages(cache, want)
    assert [cache.store.has(k) for k in want] == [True] * len(want)
    eng.cache.close()


def seq_pages(cache, keys):
    return [cache.device._by_key[k] for k in keys]


def test_a_found_page_with_other_tokens_is_not_adopted(tiny_dir, tiny_model, tmp_path):
    """Keys find pages, tokens decide: a page whose recorded tokens differ from the
    prompt's (what a key collision would look like) ends the run of found pages there."""
    eng = make_engine(tiny_model, Tokenizer.from_dir(tiny_dir), tmp_path)
    cache = eng.cache
    tokens = _prompt(5 * B + 3, 6)
    seq, _ = cache.start(tokens)
    _compute(eng, seq, len(tokens))
    pages = seq.pages[:5]
    chain = cache.chain(tokens, None)
    assert cache.device.find(chain) == pages
    cache.device._tokens[pages[3]] = cache.device._tokens[pages[2]]
    assert cache.device.find(chain) == pages[:3]
    cache.device._tokens[pages[0]] = b""
    assert cache.device.find(chain) == []
    cache.release(seq)
    eng.cache.close()


def _path_snapshots(store: CacheStore, upto: int) -> list[int]:
    return sorted(e.position for e in store.entries(limit=100_000, kind="snapshot")
                  if e.position <= upto)


def test_snapshot_thinning_keeps_recent_dense(tiny_hybrid_dir, tmp_path):
    model = load_model(tiny_hybrid_dir)
    tok = Tokenizer.from_dir(tiny_hybrid_dir)
    prompt = _prompt(1024, 6)
    later = prompt[:700] + [9, 8, 7, 6, 5]
    want = _uncached(model, tok, [prompt, later])
    eng = make_engine(model, tok, tmp_path, pages=160, interval=32, max_snapshots=6,
                      snapshot_budget=1000.0)     # no byte limit: max_snapshots decides
    client = Client(eng)
    got = client.run([prompt])[0]
    eng.cache.store.flush()
    kept = _path_snapshots(eng.cache.store, 1024 + 6)
    # The prefill planned 6 of its 31 interval positions, spaced back from the end, and
    # the prompt's and answer's ends came after: thinned to 6 as they came.
    assert 4 <= len(kept) <= 6 and kept[-1] == 1024 + 5 and 1024 in kept
    gaps = [b - a for a, b in zip(kept, kept[1:])]
    assert gaps == sorted(gaps, reverse=True) and gaps[0] >= 4 * 32   # sparse far back
    assert eng.cache.store.stats()["snapshots_thinned"] <= 2   # few written to be dropped

    client.close()
    eng.cache.close()                                 # the disk was thinned too
    eng = make_engine(model, tok, tmp_path, pages=160, interval=32, max_snapshots=6,
                      snapshot_budget=1000.0, host_budget=0)
    assert _path_snapshots(eng.cache.store, 1024 + 6) == kept
    client = Client(eng)
    again = client.run([later])[0]
    client.close()
    eng.cache.close()
    assert [got.tokens, again.tokens] == want
    assert again.fin.stats.cache_n == max(p for p in kept if p <= len(later) - 1)


@pytest.mark.parametrize("n_ctx", [16384, pytest.param(65536, marks=pytest.mark.slow)])
def test_long_context_then_short_questions(tiny_hybrid_dir, tmp_path, n_ctx):
    model = load_model(tiny_hybrid_dir)
    tok = Tokenizer.from_dir(tiny_hybrid_dir)
    context = _prompt(n_ctx, 7)
    questions = [_prompt(8 + 3 * i, 100 + i) for i in range(10)]
    opts = {"pages": n_ctx // B + 64, "interval": 1024, "step_tokens": 2048}

    def ask(eng) -> tuple[list[Result], dict[str, int]]:
        client = Client(eng)
        out = [client.submit(context + q, max_tokens=4).wait() for q in questions]
        client.close()
        return out, client.cached_by_tier

    eng = make_engine(model, tok, tmp_path, **opts)
    client = Client(eng)
    assert client.submit(context, max_tokens=1).wait().fin.stats.cache_n == 0
    client.close()
    warm, warm_tiers = ask(eng)
    eng.cache.store.flush()
    assert len(_path_snapshots(eng.cache.store, n_ctx)) <= 16
    # Forget the questions (an exact repeat would compute nothing): what is left is
    # the context alone, as after registering it.
    for e in eng.cache.store.entries(limit=100_000):
        if e.position > n_ctx:
            eng.cache.store.delete(e.key)
    eng.cache.close()
    eng = make_engine(model, tok, tmp_path, host_budget=0, **opts)    # restart: disk only
    cold, cold_tiers = ask(eng)
    eng.cache.close()

    for w, c, q in zip(warm, cold, questions):
        assert w.tokens == c.tokens
        for st in (w.fin.stats, c.fin.stats):
            assert st.cache_n == n_ctx and st.prompt_n - st.cache_n == len(q) < 300
    # Warm: the context's pages stay on the device, its snapshot in RAM. After the
    # restart the first question reads everything from disk and leaves the pages on
    # the device for the other nine; the snapshot comes from disk each time.
    assert warm_tiers == {"device": 10 * n_ctx}
    assert cold_tiers == {"device": 9 * n_ctx, "disk": n_ctx}
    assert all(r.fin.stats.cache_tier == "host" for r in warm)
    assert all(r.fin.stats.cache_tier == "disk" for r in cold)

"""Engines for the in-process tests, built as the daemon builds them (runner, cache
manager over a real store, engine), and requests run through their worker thread.
Every engine made here is stopped, checked (cache.sanity_check) and closed after its
test by the autouse fixture in conftest.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ckptd.cache.manager import CacheManager
from ckptd.cache.store import CacheStore
from ckptd.daemon.engine import Engine
from ckptd.daemon.request import Finished, Request
from ckptd.model.runner import Runner
from ckptd.model.sampling.sampler import SamplingParams

made: list[Engine] = []


def make_engine(model, tokenizer, path, *, block_size: int = 8, pages: int = 512,
                slots: int = 4, interval: int = 32, max_snapshots: int = 16,
                step_tokens: int = 48, snapshot_budget: float = 1.0,
                **store_options) -> Engine:
    """path None: no store (nothing cached)."""
    runner = Runner(model, pages, slots, block_size, max_batch_tokens=step_tokens)
    store = CacheStore(path, runner.spec, model.fingerprint, **store_options) if path else None
    cache = CacheManager(runner, runner.spec, pages, model.fingerprint, store, interval,
                         max_snapshots, snapshot_budget, step_tokens)
    eng = Engine(runner, cache, tokenizer, max_running=slots, step_tokens=step_tokens)
    made.append(eng)
    return eng


def check_and_close_all() -> None:
    engines = list(made)
    made.clear()
    for eng in engines:
        eng.stop()
    for eng in engines:
        eng.cache.sanity_check()
        eng.cache.close()


@dataclass
class Result:
    tokens: list[int] = field(default_factory=list)
    fin: Finished | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def wait(self) -> Result:
        assert self.done.wait(300), "request did not finish"
        assert self.fin.reason in ("stop", "length"), self.fin
        return self


class Client:
    """Requests through an engine running on its own thread. on_token(result) runs on
    the engine's thread between steps, where the state can be looked at."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.tiers_before = dict(engine.cached_by_tier)
        engine.start()

    def submit(self, tokens, max_tokens=6, salt=None, use_cache=True, on_token=None,
               anchors=()) -> Result:
        res = Result()

        def emit(ev):
            if isinstance(ev, Finished):
                res.fin = ev
                res.done.set()
                return
            res.tokens.append(ev.token)
            if on_token is not None:
                on_token(res)
        self.engine.submit(Request(list(tokens), SamplingParams(max_tokens=max_tokens,
                                                                ignore_eos=True),
                                   emit, salt=salt, use_cache=use_cache, anchors=anchors))
        return res

    def run(self, prompts, **kw) -> list[Result]:
        """Submit all at once, wait for all."""
        return [r.wait() for r in [self.submit(p, **kw) for p in prompts]]

    @property
    def cached_by_tier(self) -> dict[str, int]:
        """Tokens restored by tier since this client started."""
        now = self.engine.cached_by_tier
        return {t: n - self.tiers_before.get(t, 0) for t, n in now.items()
                if n - self.tiers_before.get(t, 0)}

    def close(self) -> None:
        self.engine.stop()


def run(engine: Engine, prompts, salt=None, use_cache=True, max_tokens=6):
    """Submit all prompts at once; return (tokens, Finished) per prompt."""
    client = Client(engine)
    try:
        done = client.run(prompts, salt=salt, use_cache=use_cache, max_tokens=max_tokens)
    finally:
        client.close()
    return [(r.tokens, r.fin) for r in done]


def check_cached_equals_uncached(make, path, prompts, max_tokens: int = 6,
                                 on_warm=None) -> None:
    """The cache's round trip, as every engine kind proves it: the prompts run uncached,
    then cached (filling RAM and disk), again (RAM hits), and after a restart from disk
    only, giving the same tokens every time. make(path, **store_options) builds an
    engine (path None: no store); on_warm(engine) looks at the warm engine first."""
    want = run(make(None), prompts, use_cache=False, max_tokens=max_tokens)
    eng = make(path)
    first = run(eng, prompts, max_tokens=max_tokens)
    second = run(eng, prompts, max_tokens=max_tokens)          # host tier
    if on_warm is not None:
        on_warm(eng)
    eng.cache.close()
    eng = make(path, host_budget=0)                            # a restart: disk only
    third = run(eng, prompts, max_tokens=max_tokens)
    eng.cache.close()
    for w, a, b, c in zip(want, first, second, third):
        assert w[0] == a[0] == b[0] == c[0]
    assert all(r[1].stats.cache_n > 0 for r in second)
    assert any(r[1].stats.cache_tier == "disk" for r in third)


def restored_last_logits(make, path, prompt, longer, restart: bool):
    """Cache prompt, then start longer (prompt + a few tokens) from the cache, in the
    same engine (RAM) or after a restart (disk only), and compute the rest in one step:
    (its last logits, the restore's info)."""
    eng = make(path)
    run(eng, [prompt], max_tokens=1)
    eng.cache.store.flush()
    if restart:
        eng.cache.close()
        eng = make(path, host_budget=0)
    seq, info = eng.cache.start(longer)
    n = len(longer) - seq.num_computed
    eng.cache.prepare([(seq, n)])
    got = eng.runner.step([(seq, n)])[0]
    eng.cache.release(seq)
    eng.cache.close()
    return got, info

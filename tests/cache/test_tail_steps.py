"""Tail snapshots on a real hybrid runner and store: a rung that needs a step of its own
is taken only while its cost stays within 3% of the prefill's (by the measured rates),
one where a step ends anyway is free, and none is written to the store while the
prompt is still in its tail (its last steps wait for no store write)."""

from __future__ import annotations

import torch

from ckptd.cache.entry import INTERVAL, TAIL
from ckptd.cache.manager import CacheManager
from ckptd.cache.store import CacheStore
from ckptd.cache.work import Work
from ckptd.model.loader import load_model
from ckptd.model.runner import Runner
from ckptd.model.sequence import Sequence

B, STEP, PAGES = 16, 512, 160
N = 2_100                  # intervals at 1,024 and 2,048; steps end at 512, 1,536 too


def _cache(model, path, step_s: float) -> tuple[Runner, CacheManager]:
    runner = Runner(model, PAGES, 2, B, max_batch_tokens=STEP)
    store = CacheStore(path, runner.spec, model.fingerprint)
    cache = CacheManager(runner, runner.spec, PAGES, model.fingerprint, store,
                         snapshot_interval=1024, step_tokens=STEP)
    cache.rates.prefill_tps, cache.rates.measured_step = 10_000.0, step_s
    return runner, cache


def _tokens() -> list[int]:
    return torch.randint(3, 500, (N,), generator=torch.Generator().manual_seed(5)).tolist()


def _stored_tails(cache) -> list[int]:
    cache.store.flush()
    return sorted(e.position for e in cache.store.entries(limit=1000, kind="snapshot")
                  if e.role == TAIL)


def test_tails_taken_by_their_cost_and_stored_after_the_prompt(tiny_hybrid_dir, tmp_path):
    model = load_model(tiny_hybrid_dir)
    # a step costs 1 ms of a 210 ms prefill: every rung is worth its own step
    runner, cache = _cache(model, tmp_path / "cheap", 0.001)
    seq = Sequence(_tokens())
    cache.restore(seq)
    stops = dict(cache.live[seq.id].stops)
    assert stops == {1024: INTERVAL, 2048: INTERVAL,        # the 64 rung: 52 back
                     1844: TAIL, 1536: TAIL}                # 256: its own; 1,024: free
    first = True
    while seq.num_computed < N:
        work = Work(seq, cache.chunk(seq, STEP), new=first)
        first = False
        cache.admit([work])
        if seq.num_computed >= 1536:                        # in its tail: nothing stored
            assert _stored_tails(cache) == []
        logits = runner.run([(seq, work.n)])
        cache.after_step([work], logits)
    cache.admit([Work(seq, 0)])                             # the next step: stored now
    assert _stored_tails(cache) == [1536, 1844]
    cache.finish(seq, checkpoint=False)
    cache.close()

    # a step costs 10 ms, 4.8% of the prefill: only the free rung
    runner, cache = _cache(model, tmp_path / "dear", 0.010)
    seq = Sequence(_tokens())
    cache.restore(seq)
    assert cache.live[seq.id].stops == {1024: INTERVAL, 2048: INTERVAL, 1536: TAIL}
    cache.release(seq)
    cache.close()

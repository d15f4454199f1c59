"""The cache manager over a real runner and store: device pages shared between
sequences, copy-on-write, running out of pages and cells, publishing, invariants.
Every output is compared with an uncached computation."""

from __future__ import annotations

import pytest
import torch

from ckptd.cache.device import OutOfPages
from ckptd.cache.manager import CacheManager
from ckptd.cache.store import CacheStore
from ckptd.cache.work import Deferred, Failed, Stalled, Work
from ckptd.model.runner import Runner
from ckptd.model.sequence import Sequence
from ckptd.model.spec import OutOfCells
from ckptd.model.testing import prompt_logits

TOL = 1e-5
B = 16


def _prompt(n, seed):
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _close(a, b):
    return (a - b).abs().max().item() <= TOL


@pytest.fixture
def make(tiny_model, tmp_path):
    """make(num_pages, num_cells) -> (runner, cache); the cache is checked and closed
    after the test."""
    made = []

    def build(num_pages: int, num_cells: int):
        runner = Runner(tiny_model, num_pages, num_cells, B)
        store = CacheStore(tmp_path / f"store{len(made)}", runner.spec, tiny_model.fingerprint)
        cache = CacheManager(runner, runner.spec, num_pages, tiny_model.fingerprint, store,
                             snapshot_interval=B)
        made.append(cache)
        return runner, cache
    yield build
    for cache in made:
        cache.sanity_check()
        cache.close()


def _run(runner, cache, seq, n):
    """One step of n tokens for seq, as the engine runs it."""
    work = Work(seq, n)
    cache.prepare([(seq, n)])
    logits = runner.run([(seq, n)])
    cache.after_step([work], logits)
    return logits.last(seq)


def test_adopted_prefix_pages_match_unshared(tiny_model, make):
    prefix = _prompt(32, 4)
    suffixes = [_prompt(9, 5), _prompt(21, 6)]
    runner, cache = make(num_pages=10, num_cells=3)
    owner, _ = cache.start(prefix + [1])
    _run(runner, cache, owner, 32)
    cache.finish(owner)                                   # snapshot at 32, pages cached
    assert cache.device.num_cached == 2                   # kept for later prefix hits

    seqs = []
    for suffix in suffixes:
        seq, info = cache.start(prefix + suffix)
        assert info.cached_tokens == 32 and info.device_tokens == 32
        seqs.append(seq)
    assert seqs[0].pages == seqs[1].pages
    assert [cache.device.refs[p] for p in seqs[0].pages] == [3, 3]   # table + 2 sequences
    work = [(s, len(s.tokens) - 32) for s in seqs]
    cache.prepare(work)
    got = runner.step(work)
    for row, suffix in enumerate(suffixes):
        assert _close(got[row], prompt_logits(tiny_model, prefix + suffix)[-1])
    assert seqs[0].pages[:2] == seqs[1].pages[:2]         # full pages still shared
    for s in seqs:
        cache.release(s)
    assert cache.device.num_cached == 2 and cache.device.num_free == 8
    assert cache.device.evict_cached() == 2
    assert cache.device.refs == [0] * 10 and runner.cells.num_free == 3


def test_copy_on_write_of_shared_partial_page(tiny_model, make):
    base = _prompt(20, 8)                                  # page 0 full, page 1 holds 4
    runner, cache = make(num_pages=8, num_cells=2)
    parent, _ = cache.start(base + [11, 12, 13], use_cache=False)
    _run(runner, cache, parent, 20)
    child = cache.fork(parent)
    child.tokens[20:] = [21, 22, 23, 24]
    assert child.pages == parent.pages and cache.device.refs[parent.pages[1]] == 2
    before = runner.read_partial(parent.pages[1], 4)

    got_child = _run(runner, cache, child, 4)              # writes into its own copy
    assert child.pages[0] == parent.pages[0] and child.pages[1] != parent.pages[1]
    assert torch.equal(runner.read_partial(parent.pages[1], 4), before)
    assert cache.device.refs[parent.pages[1]] == 1
    got_parent = _run(runner, cache, parent, 3)            # no longer shared: in place
    assert _close(got_child, prompt_logits(tiny_model, base + [21, 22, 23, 24])[-1])
    assert _close(got_parent, prompt_logits(tiny_model, base + [11, 12, 13])[-1])
    cache.release(parent)
    cache.release(child)
    assert cache.device.refs == [0] * 8


def test_both_sharers_writing_in_one_step(tiny_model, make):
    base = _prompt(19, 9)
    runner, cache = make(num_pages=8, num_cells=2)
    a, _ = cache.start(base + [5], use_cache=False)
    _run(runner, cache, a, 19)
    b = cache.fork(a)
    b.tokens[19] = 6
    cache.prepare([(a, 1), (b, 1)])
    got = runner.step([(a, 1), (b, 1)])
    assert _close(got[0], prompt_logits(tiny_model, base + [5])[-1])
    assert _close(got[1], prompt_logits(tiny_model, base + [6])[-1])
    assert len({a.pages[1], b.pages[1]}) == 2
    cache.release(a)
    cache.release(b)
    assert cache.device.num_free == 8


def test_out_of_pages_and_cells_change_nothing(tiny_model, make):
    runner, cache = make(num_pages=2, num_cells=1)
    seq, _ = cache.start(_prompt(40, 1))
    with pytest.raises(OutOfPages):
        cache.prepare([(seq, 40)])
    assert seq.pages == [] and seq.num_computed == 0 and cache.device.num_free == 2
    with pytest.raises(OutOfCells):
        cache.start([1, 2, 3])
    assert len(cache.live) == 1
    _run(runner, cache, seq, 32)                           # what fits still runs
    assert cache.device.num_free == 0
    cache.release(seq)


def test_admit_defers_a_new_sequence_without_room_and_stalls_a_running_one(tiny_model, make):
    runner, cache = make(num_pages=3, num_cells=2)
    first, _ = cache.start(_prompt(48, 2), use_cache=False)
    _run(runner, cache, first, 48)                         # all three pages
    late_seq = Sequence(_prompt(20, 3))
    cache.restore(late_seq)
    late = Work(late_seq, cache.chunk(late_seq, 20), new=True)
    going = Work(first, cache.chunk(first, 1))
    cache.admit([going, late])
    assert isinstance(late.refused, Deferred) and late.seq.cell < 0 \
        and late.seq.id not in cache.live
    assert going.n == 0 and going.refused is None          # 48 of 48 computed: nothing left
    first.tokens.append(7)                                 # a 49th token needs a 4th page
    going = Work(first, cache.chunk(first, 1))
    cache.admit([going])                                   # nothing else runs: it can't wait
    assert isinstance(going.refused, Failed) and "out of KV cache" in str(going.refused.error)
    cache.release(first)


def test_admit_stalls_a_running_sequence_while_others_run_else_sends_a_prefill_back(
        tiny_model, make):
    runner, cache = make(num_pages=3, num_cells=3)
    a, _ = cache.start(_prompt(32, 4), use_cache=False)
    b, _ = cache.start(_prompt(20, 5), use_cache=False)
    _run(runner, cache, a, 32)                             # two full pages
    _run(runner, cache, b, 5)                              # the third, 5 of its 16 used
    a.tokens.append(7)                                     # a decodes: it needs a 4th page
    wa, wb = Work(a, cache.chunk(a, 1)), Work(b, cache.chunk(b, 1))
    cache.admit([wa, wb])
    assert isinstance(wa.refused, Stalled) and wa.n == 1   # it waits: b runs
    assert wb.runs
    wa, wb = Work(a, cache.chunk(a, 1)), Work(b, cache.chunk(b, 16))
    cache.admit([wa, wb])                                  # b's 15 tokens need a 4th page too
    assert isinstance(wb.refused, Deferred) and b.id not in cache.live and b.pages == []
    assert isinstance(wa.refused, Stalled)                 # the pages b gave back are a's next
    cache.release(a)


def test_publish_switches_to_an_equal_registered_page(tiny_model, make):
    tokens = _prompt(16, 12)
    runner, cache = make(num_pages=4, num_cells=2)
    a, _ = cache.start(tokens + [1])
    b, _ = cache.start(tokens + [2])
    cache.prepare([(a, 16), (b, 16)])
    out = runner.run([(a, 16), (b, 16)])
    assert a.pages != b.pages
    own = b.pages[0]
    cache.after_step([Work(a, 16), Work(b, 16)], out)
    assert b.pages == a.pages and cache.device.refs[own] == 0
    assert cache.device.refs[a.pages[0]] == 3              # table + both
    cache.release(a)
    cache.release(b)


def test_sanity_check_fails_on_a_leaked_page(tiny_model, make):
    runner, cache = make(num_pages=4, num_cells=1)
    seq, _ = cache.start(_prompt(20, 13))
    _run(runner, cache, seq, 20)
    cache.sanity_check()
    cache.device.incref(seq.pages[:1])                     # a reference nobody holds
    with pytest.raises(AssertionError, match="leaked"):
        cache.sanity_check()
    cache.device.decref(seq.pages[:1])
    cache.release(seq)


def test_a_store_of_another_fingerprint_is_refused(tiny_model, tmp_path):
    """The manager's keys are the store's (CacheStore.chain, under the store's
    fingerprint): a store opened for another model would name them for that one."""
    runner = Runner(tiny_model, 4, 1, B)
    store = CacheStore(tmp_path / "other", runner.spec, "another model")
    with pytest.raises(ValueError, match="fingerprint"):
        CacheManager(runner, runner.spec, 4, tiny_model.fingerprint, store)
    store.close()

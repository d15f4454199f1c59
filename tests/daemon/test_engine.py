"""The central property: a restored cache gives the same tokens and logits as no cache."""

from __future__ import annotations

import lmdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptd.cache.device import OutOfPages
from ckptd.cache.keys import block_keys, blocks_hashed
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.testing import prompt_logits
from ckptd.model.text.tokenizer import Tokenizer
from tests.daemon.engines import check_cached_equals_uncached, restored_last_logits, run
from tests.daemon.engines import make_engine as _make

B, INTERVAL = 8, 32


def make_engine(model, path, tok=None, **kw):
    # every interval snapshot (no byte budget): these tests restore from them
    kw.setdefault("snapshot_budget", 1000.0)
    return _make(model, tok, path, block_size=B, interval=INTERVAL, **kw)


def compute(eng, seq, n=None):
    """Compute the rest of seq's prompt (or n tokens) in one step: its last logits."""
    n = len(seq.tokens) - seq.num_computed if n is None else n
    eng.cache.prepare([(seq, n)])
    return eng.runner.step([(seq, n)])[0]


def _tok(tiny_dir):
    return Tokenizer.from_dir(tiny_dir)


prefix_pool = [list(range(3, 3 + n)) for n in (5, 19, 40, 77)]
requests = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30), st.integers(1, 9)),
                    min_size=2, max_size=5)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(reqs=requests)
def test_cached_equals_uncached_random_sharing(tiny_dir, tiny_model, tmp_path_factory, reqs):
    random_sharing(tiny_dir, tiny_model, tmp_path_factory, reqs)


def random_sharing(tiny_dir, tiny_model, tmp_path_factory, reqs):
    """Requests sharing random prefixes, run uncached, then cached (RAM), again (RAM
    hits), and after a restart (disk only): the same tokens every time."""
    tok = _tok(tiny_dir)
    prompts = [prefix_pool[p][:cut + 1] + [400 + s] * s for p, cut, s in reqs]
    check_cached_equals_uncached(lambda path, **kw: make_engine(tiny_model, path, tok, **kw),
                                 tmp_path_factory.mktemp("store"), prompts)


def test_restored_logits_match_uncached(tiny_dir, tiny_model, tmp_path):
    prompt = list(range(10, 10 + 70))
    longer = prompt + [5, 6, 7]
    want = prompt_logits(tiny_model, longer)
    tok = _tok(tiny_dir)

    def make(path, **kw):
        return make_engine(tiny_model, path, tok, **kw)
    for restart in (False, True):
        got, info = restored_last_logits(make, tmp_path / str(restart), prompt, longer, restart)
        assert info.cached_tokens == 70 and info.tier == ("disk" if restart else "host")
        assert (got - want[-1]).abs().max() <= 1e-5


def test_corrupt_store_falls_back_to_correct_output(tiny_dir, tiny_model, tmp_path):
    tok = _tok(tiny_dir)
    prompts = [list(range(20, 20 + 60)), list(range(20, 20 + 60)) + [9, 9]]
    want = run(make_engine(tiny_model, None, tok), prompts, use_cache=False)
    eng = make_engine(tiny_model, tmp_path, _tok(tiny_dir))
    run(eng, prompts[:1])
    eng.cache.close()
    env = lmdb.open(str(tmp_path), max_dbs=4)
    flipped = 0
    for name in (b"blocks", b"snapshots"):             # flip a byte in every value
        db = env.open_db(name, create=False)
        with env.begin(write=True, db=db) as txn:
            for k, v in list(txn.cursor()):
                b = bytearray(v)
                b[len(b) // 2] ^= 0x10
                txn.put(k, bytes(b))
                flipped += 1
    env.close()
    assert flipped > 0
    eng = make_engine(tiny_model, tmp_path, _tok(tiny_dir), host_budget=0)
    got = run(eng, prompts)
    assert [g[0] for g in got] == [w[0] for w in want]
    assert eng.cache.store.stats()["corrupt_dropped"] > 0
    eng.cache.close()


def test_restores_decode_into_pool_pages_and_leak_none(tiny_dir, tiny_model, tmp_path):
    """The engine's restores decode straight into pool pages taken for them (_load):
    from RAM, from disk, and from disk past a damaged block, the logits are the
    uncached ones, and once the sequences are gone every page is free again."""
    prompt = list(range(30, 30 + 70))
    longer = prompt + [5, 6, 7]
    want = prompt_logits(tiny_model, longer)[-1]
    eng = make_engine(tiny_model, tmp_path, _tok(tiny_dir))
    run(eng, [prompt], max_tokens=1)
    eng.cache.store.flush()
    pool = eng.cache.device

    def restore_and_check(tier):
        pool.evict_cached()                        # no device pages: read the store
        into = []
        real = eng.cache.store.load
        eng.cache.store.load = lambda plan, into_pages=None, *more: \
            into.append(into_pages is not None) or real(plan, into_pages, *more)
        seq, info = eng.cache.start(longer)
        eng.cache.store.load = real
        assert info.tier == tier and info.cached_tokens > 0 and all(into) and into
        got = compute(eng, seq)
        assert (got - want).abs().max() <= 1e-5
        eng.cache.release(seq)
        pool.evict_cached()
        assert pool.num_free == pool.num_pages     # nothing leaked
        return info

    restore_and_check("host")
    damaged = block_keys(eng.cache.store.root(None), prompt, B)[6]   # tokens 48..55
    eng.cache.close()
    env = lmdb.open(str(tmp_path), max_dbs=4)
    db = env.open_db(b"blocks", create=False)
    with env.begin(write=True, db=db) as txn:
        txn.put(damaged, txn.get(damaged)[:100])
    env.close()
    eng = make_engine(tiny_model, tmp_path, _tok(tiny_dir), host_budget=0)
    pool = eng.cache.device
    info = restore_and_check("disk")
    assert eng.cache.store.stats()["corrupt_dropped"] == 1
    assert info.fallbacks == 1 and 0 < info.cached_tokens <= 48
    restore_and_check("disk")                          # and again, from what is left
    eng.cache.close()


def test_pages_for_a_restore_never_reclaim_the_device_pages_it_uses(tiny_dir, tiny_model,
                                                                    tmp_path):
    """A restore takes pool pages for the blocks it reads from the store; when the pool
    is short, it must not reclaim the cached device pages the same restore adopts: it
    is refused (OutOfPages, the scheduler retries later) and those pages stay cached."""
    tok = _tok(tiny_dir)
    doc = list(range(40, 40 + 80))                     # 10 blocks
    eng = make_engine(tiny_model, tmp_path, tok, pages=16, slots=4)
    cache = eng.cache
    run(eng, [doc[:40], doc], max_tokens=1)            # the store holds all 10 blocks
    cache.store.flush()
    pool = cache.device
    pool.evict_cached()
    run(eng, [doc[:40]], max_tokens=1)                 # back on the device: 5 blocks
    found = pool.find(cache.chain(doc + [7], None))
    assert len(found) == 5
    filler, _ = cache.start([1] * (pool.num_free - 2) * B, use_cache=False)
    cache.prepare([(filler, len(filler.tokens))])      # leave 2 pages free
    question = doc + [7]
    with pytest.raises(OutOfPages):
        cache.start(question)
    assert pool.find(cache.chain(question, None)) == found   # still cached, untouched
    cache.release(filler)
    seq, info = cache.start(question)
    assert info.device_tokens == 40 and info.cached_tokens >= 64
    got = compute(eng, seq)
    assert (got - prompt_logits(tiny_model, question)[-1]).abs().max() <= 1e-5
    cache.release(seq)
    eng.cache.close()


def test_exact_repeat_computes_nothing_and_salts_isolate(tiny_dir, tiny_model, tmp_path):
    prompt = list(range(30, 30 + 45))
    eng = make_engine(tiny_model, tmp_path, _tok(tiny_dir))
    a = run(eng, [prompt], salt="A")
    b = run(eng, [prompt], salt="A")
    c = run(eng, [prompt], salt="B")
    assert a[0][0] == b[0][0] == c[0][0]
    assert b[0][1].stats.cache_n == len(prompt)             # exact repeat: nothing computed
    assert c[0][1].stats.cache_n == 0                       # another tenant sees nothing
    eng.cache.close()


def test_multi_turn_resumes_after_previous_answer(tiny_dir, tiny_model, tmp_path):
    tok = _tok(tiny_dir)
    eng = make_engine(tiny_model, tmp_path, _tok(tiny_dir))
    msgs, computed, prev_prompt_len = [], [], 0
    for turn in range(6):
        msgs.append({"role": "user", "content": f"question number {turn} about the cache"})
        ids = tok.encode(tok.apply_chat_template(msgs))
        (toks, fin), = run(eng, [ids], max_tokens=5)
        if turn:
            # the state after the previous answer was checkpointed: everything this prompt
            # shares with (previous prompt + answer) is restored, not recomputed
            common = 0
            while common < min(len(ids), len(computed)) and ids[common] == computed[common]:
                common += 1
            assert fin.stats.cache_n >= min(common, len(ids) - 1), (turn, fin.stats, common)
            assert fin.stats.cache_n > prev_prompt_len - 4
        prev_prompt_len = len(ids)
        computed = ids + toks[:-1]          # the last sampled token was never run
        msgs.append({"role": "assistant", "content": tok.decode(toks, skip_special_tokens=True)})
    eng.cache.close()


def test_block_keys_are_hashed_once_per_request(tiny_dir, tiny_model, tmp_path):
    """The scheduler hashes a prompt's block keys once; the device lookup, the store's
    plan, the checkpoints and the thinning all read that chain, which grows by the
    blocks the answer fills. A second question after the same document hashes only
    its own blocks (the recent chains share theirs)."""
    eng = make_engine(tiny_model, tmp_path, _tok(tiny_dir), max_snapshots=3)
    doc = list(range(7, 7 + 10 * B + 3))            # 10 full blocks and 3 tokens
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    before = blocks_hashed()
    first = eng.generate([doc], params)[0]
    computed = len(doc) + len(first) - 1             # the last sampled token never runs
    assert blocks_hashed() - before == computed // B  # every block once, answer included
    question = doc + [400, 401, 402, 403, 404, 405, 406]
    before = blocks_hashed()
    eng.generate([question], params)
    # the prompt's 11th block (doc's 3 tokens, 5 of the question's) and the 12th, which
    # the answer fills: the document's 10 came from the recent chain
    assert blocks_hashed() - before == (len(question) + 11) // B - 10
    assert eng.counters["cached_tokens"] >= 10 * B
    eng.cache.close()

"""Branch points: a prefill stops where prompts part and leaves a snapshot there, so
requests over one document compute it once and then only their own tokens. Every
answer is compared with the uncached one."""

from __future__ import annotations

import torch

from ckptd.model.loader import load_model
from ckptd.model.text.tokenizer import Tokenizer
from tests.daemon.engines import Client, make_engine

B = 16


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _computed(results) -> int:
    return sum(r.fin.stats.prompt_n - r.fin.stats.cache_n for r in results)


def _engine(model, tok, path, **kw):
    return make_engine(model, tok, path, block_size=B, pages=8192, interval=1024,
                       step_tokens=1024, **kw)


def _uncached(model, tok, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt's 4 greedy tokens with no cache: what a cached run must give."""
    plain = Client(_engine(model, tok, None))
    want = [r.tokens for r in plain.run(prompts, max_tokens=4, use_cache=False)]
    plain.close()
    return want


def test_a_burst_of_questions_over_one_new_document_computes_it_once(tiny_hybrid_dir,
                                                                        tmp_path):
    model = load_model(tiny_hybrid_dir)
    tok = Tokenizer.from_dir(tiny_hybrid_dir)
    doc = _prompt(16384, 1)
    # questions that share some of their first tokens, as chat turns do
    questions = [[7, 8, 9, *_prompt(9 + i, 100 + i)] for i in range(8)]
    prompts = [doc + q for q in questions]
    want = _uncached(model, tok, prompts)

    client = Client(_engine(model, tok, tmp_path))
    got = client.run(prompts, max_tokens=4)
    client.close()
    client.engine.cache.close()
    assert [r.tokens for r in got] == want
    longest = max(len(q) for q in questions)
    assert _computed(got) <= len(doc) + 8 * (longest + 16) + 1024
    # the document's end is a branch point now: every later question after it
    # computes only itself, from a snapshot where the questions part
    again = Client(_engine(model, tok, tmp_path, host_budget=0))     # a restart
    q = [7, 8, 9, *_prompt(5, 999)]
    one = again.run([doc + q], max_tokens=4)[0]
    again.close()
    assert one.fin.stats.prompt_n - one.fin.stats.cache_n <= len(q)


def test_questions_after_a_document_compute_only_themselves_from_the_second(tiny_hybrid_dir,
                                                                           tmp_path):
    """One at a time: the first computes everything and leaves tail snapshots just before
    its end; the second restores from the nearest (at most 64 tokens before its end),
    computes up to where it parts from the first, leaving a branch snapshot there that
    replaces the tails; every later one computes only its own tokens. After a restart
    too, and every answer is the uncached one."""
    model = load_model(tiny_hybrid_dir)
    tok = Tokenizer.from_dir(tiny_hybrid_dir)
    doc = _prompt(6000, 2)
    questions = [_prompt(10 + 3 * i, 200 + i) for i in range(6)]
    want = _uncached(model, tok, [doc + q for q in questions])
    eng = _engine(model, tok, tmp_path)
    client = Client(eng)
    got = [client.run([doc + q], max_tokens=4)[0] for q in questions[:4]]
    client.close()
    eng.cache.store_pending()
    roles = {e.position: e.role for e in eng.cache.store.entries(limit=1000, kind="snapshot")}
    eng.cache.close()
    assert [r.tokens for r in got] == want[:4]
    computed = [r.fin.stats.prompt_n - r.fin.stats.cache_n for r in got]
    assert computed[1] <= 64 + len(questions[1])
    assert all(c <= len(q) for c, q in zip(computed[2:], questions[2:4]))
    assert roles[len(doc)] == "branch" and "tail" not in roles.values()   # replaced
    again = Client(_engine(model, tok, tmp_path, host_budget=0))          # a restart
    after = [again.run([doc + q], max_tokens=4)[0] for q in questions[4:]]
    again.close()
    assert [r.tokens for r in after] == want[4:]
    assert all(r.fin.stats.prompt_n - r.fin.stats.cache_n <= len(q)
               for r, q in zip(after, questions[4:]))


def test_the_first_question_after_a_document_computes_at_most_64_tokens_more(
        tiny_hybrid_dir, tmp_path):
    """The document with a first question, then, after a restart, another question:
    it restores from the first prompt's tail snapshot 64 tokens before its end (a
    document long enough for the tail's own step to cost within 3% of its prefill)."""
    model = load_model(tiny_hybrid_dir)
    tok = Tokenizer.from_dir(tiny_hybrid_dir)
    doc = _prompt(6000, 3)
    q1, q2 = _prompt(20, 301), _prompt(17, 302)
    want = _uncached(model, tok, [doc + q2])[0]
    first = Client(_engine(model, tok, tmp_path))
    first.run([doc + q1], max_tokens=4)
    assert first.engine.cache.rates.measured_step > 0     # tails' next plans: measured
    first.close()
    first.engine.cache.close()
    again = Client(_engine(model, tok, tmp_path, host_budget=0))
    got = again.run([doc + q2], max_tokens=4)[0]
    again.close()
    assert got.tokens == want
    assert got.fin.stats.cache_n == len(doc) + len(q1) - 64
    assert got.fin.stats.prompt_n - got.fin.stats.cache_n == 64 - len(q1) + len(q2)


def test_an_anchor_leaves_a_snapshot_where_the_next_prompt_parts(tiny_hybrid_dir, tmp_path):
    """A named context's end (an anchor the HTTP side sets, daemon/prompt.py): the first
    request naming it stops there on its way, so the next one computes only itself,
    though the context's own snapshot is gone (here: never made)."""
    model = load_model(tiny_hybrid_dir)
    tok = Tokenizer.from_dir(tiny_hybrid_dir)
    ctx = _prompt(2500, 4)
    q1, q2 = _prompt(300, 401), _prompt(11, 402)
    want = _uncached(model, tok, [ctx + q2])[0]
    client = Client(_engine(model, tok, tmp_path))
    results = [client.submit(ctx + q, 4, anchors=(len(ctx),)).wait() for q in (q1, q2)]
    client.close()
    assert results[1].tokens == want
    assert results[1].fin.stats.cache_n == len(ctx)

"""The cache on the state space hybrids (Nemotron-H, Granite-4.0-H, Falcon-H1, Mamba2,
Jamba) and the sliding-window models (Gemma 3): the hybrids' StateSpec declares a conv
and an SSM state per recurrent layer, and the cache stores, thins and restores those
as it does Gated DeltaNet's; the store keeps every page of a window layer's KV (the
device only what a live window reads: cache/windows.py), so a restore at any prefix is
exact. Every cache path must give the uncached tokens.
test_engine.py's properties, run on each; and a burst of questions over a 16K-token
document computes the document once and then only the questions, before and after a
restart."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from ckptd.model.text.tokenizer import Tokenizer
from tests.conftest import HF_ARCHES
from tests.daemon import test_engine as base
from tests.daemon.engines import Client, make_engine
from tests.reliability.test_long_context import uncached_answers


@pytest.mark.parametrize("arch", HF_ARCHES)
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(reqs=base.requests)
def test_cached_equals_uncached_random_sharing(hf_dirs, hf_models, tmp_path_factory, arch,
                                               reqs):
    base.random_sharing(hf_dirs[arch], hf_models[arch], tmp_path_factory, reqs)


@pytest.mark.parametrize("arch", HF_ARCHES)
def test_restored_logits_match_uncached(hf_dirs, hf_models, tmp_path, arch):
    base.test_restored_logits_match_uncached(hf_dirs[arch], hf_models[arch], tmp_path)


@pytest.mark.parametrize("arch", HF_ARCHES)
def test_three_turns_resume_after_the_previous_answer(hf_dirs, hf_models, tmp_path, arch):
    """A chat whose client sends back the answer's tokens (as llama.cpp's server keeps
    them): each turn restores the state after the previous answer (its end-of-
    generation snapshot) and computes only the new message, and every answer is what
    the uncached conversation gives."""
    tok = Tokenizer.from_dir(hf_dirs[arch])
    model = hf_models[arch]
    plain = base.make_engine(model, None, tok)
    eng = base.make_engine(model, tmp_path, tok)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "hello there"}]))
    computed: list[int] = []
    for turn in range(3):
        (toks, fin), = base.run(eng, [ids], max_tokens=5)
        assert toks == base.run(plain, [ids], max_tokens=5, use_cache=False)[0][0]
        if turn:
            assert fin.stats.cache_n >= len(computed), (turn, fin.stats, len(computed))
        computed = ids + toks[:-1]                  # the last sampled token never ran
        ids = ids + toks + tok.encode(f"<|im_end|>\n<|im_start|>user\nquestion {turn} about "
                                      "the cache<|im_end|>\n<|im_start|>assistant\n")
    eng.cache.close()


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("arch", HF_ARCHES)
def test_questions_over_a_16k_document_compute_only_themselves(hf_dirs, hf_models, tmp_path,
                                                               arch):
    """Two questions arrive together over a new 16K-token document: it is computed once,
    both questions stop where they part and leave a snapshot there, so the second
    computes only itself; after a restart (disk only) a third computes only itself.
    Every answer is the uncached one (the document prefilled once, each question from
    a copy of its state)."""
    doc = _prompt(16384, 1)
    questions = [[7, 8, 9, *_prompt(9 + i, 100 + i)] for i in range(3)]
    want = uncached_answers(hf_dirs[arch], doc, questions)
    model, tok = hf_models[arch], Tokenizer.from_dir(hf_dirs[arch])

    def engine(**kw):
        return make_engine(model, tok, tmp_path, block_size=16, pages=2048, interval=1024,
                           step_tokens=1024, **kw)
    client = Client(engine())
    got = client.run([doc + q for q in questions[:2]], max_tokens=4)
    client.close()
    client.engine.cache.close()
    assert [r.tokens for r in got] == want[:2]
    computed = [r.fin.stats.prompt_n - r.fin.stats.cache_n for r in got]
    assert sum(computed) <= len(doc) + len(questions[0]) + len(questions[1]), computed
    assert min(computed) <= len(questions[1]), computed
    again = Client(engine(host_budget=0))                      # a restart
    third = again.run([doc + questions[2]], max_tokens=4)[0]
    again.close()
    again.engine.cache.close()
    assert third.tokens == want[2]
    assert third.fin.stats.cache_tier == "disk"
    assert third.fin.stats.prompt_n - third.fin.stats.cache_n <= len(questions[2])

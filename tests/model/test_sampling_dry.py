"""DRY (model/sampling/dry.py) against the definition written out naively here: for every
earlier position, the longest run of tokens before it that repeats the end of the
sequence (cut at the last breaker); the token that followed the run is penalised."""

from __future__ import annotations

import random

import pytest
import torch

from ckptd.model.sampling.dry import Dry, DryParams, breaker_tokens
from ckptd.model.sampling.sampler import Sampler, SamplingParams


def _naive(history: list[int], p: DryParams, single: set[int]) -> dict[int, float]:
    n = len(history) if p.penalty_last_n < 0 else min(len(history), p.penalty_last_n)
    last = history[len(history) - n:]
    if n <= p.allowed_length:
        return {}
    limit = n                            # single-token breakers only, in this check
    for i in range(n):
        if last[n - 1 - i] in single:
            limit = i
            break
    if limit < p.allowed_length:
        return {}
    best: dict[int, int] = {}
    for j in range(n - 1):     # the run ending at j (overlaps allowed), then last[j + 1]
        m = 0
        while m <= j and last[j - m] == last[n - 1 - m]:
            m += 1
        m = min(m, limit)
        if m >= p.allowed_length:
            tok = last[j + 1]
            best[tok] = max(best.get(tok, -1), m)
    return {t: p.multiplier * p.base ** (m - p.allowed_length) for t, m in best.items()
            if t not in single}


@pytest.mark.parametrize("seed", range(40))
def test_penalties_match_the_definition(seed):
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 8])
    history = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
    breaker = rng.choice([None, 0])
    p = DryParams(0.8, 1.75, rng.choice([1, 2, 3]), rng.choice([-1, 10, 25]),
                  () if breaker is None else ((breaker, ()),))
    got = Dry(p, history).penalties()
    want = _naive(history, p, set() if breaker is None else {breaker})
    assert got.keys() == want.keys()
    for t in got:
        assert got[t] == pytest.approx(want[t])


def test_llama_cpp_example():
    # llama-sampler.cpp's own: "a b c c b c y a b c" -> c extends a b c (3), y extends b c
    a, b, c, y = 1, 2, 3, 4
    p = DryParams(1.0, 2.0, 2, -1, ())
    pen = Dry(p, [a, b, c, c, b, c, y, a, b, c]).penalties()
    assert pen == {c: 2.0 ** (3 - 2), y: 2.0 ** (2 - 2)}


def test_breaker_tokens_as_llama_cpp_matches_them():
    texts = ["a", "b:", ":", "x\n", "ab", "q*", "zz", "*"]
    encode = {"": [], "c": [9], "bc": [4, 9]}.__getitem__     # what tails tokenize to
    got = set(breaker_tokens(["\n", ":", "abc"], texts, encode))
    # every token holding a breaker is one on its own; "a" and "ab" start "abc"
    assert {(1, ()), (2, ()), (3, ())} <= got
    assert (0, (4, 9)) in got and (4, (9,)) in got
    assert not any(t == 6 for t, _ in got)


def test_a_sampler_with_dry_stops_a_greedy_loop():
    """Logits that always prefer continuing a cycle 1 2 3: plain greedy repeats it, DRY
    breaks it once the repeat is long enough to cost more than the preference."""
    def logits_for(history):
        row = torch.zeros(6)
        row[{1: 2, 2: 3, 3: 1}.get(history[-1], 1)] = 2.0
        return row

    def run(params):
        s, seq = Sampler(params, [1, 2, 3]), [1, 2, 3]
        for _ in range(12):
            seq.append(s(logits_for(seq)).token)
        return seq[3:]
    plain = run(SamplingParams(temperature=0.0))
    assert plain == [1, 2, 3] * 4
    dry = run(SamplingParams(temperature=0.0, dry=DryParams(0.8, 1.75, 2, -1, ())))
    assert dry != plain and dry[:2] == [1, 2]           # allowed_length 2: the start passes
    off = run(SamplingParams(temperature=0.0, samplers=("top_k",),
                             dry=DryParams(0.8, 1.75, 2, -1, ())))
    assert off == plain                                  # a list without "dry" runs none

"""Logit bias and repetition penalties against a plain loop that follows llama.cpp's
and OpenAI's definitions, token by token, in both counting conventions."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch

from ckptd.model.sampling.penalties import Penalties
from ckptd.model.sampling.sampler import Sampler, SamplingParams

V = 50


def _expected(logits, prompt, out, p: SamplingParams):
    """One row by the book: bias, then for each counted token the repetition penalty
    and count * frequency + presence."""
    row = [float(x) for x in logits]
    for t, b in p.logit_bias:
        row[t] += b
    if p.penalty_last_n == 0:
        return row
    if p.penalty_last_n is None:
        counts, repeated = Counter(out), set(prompt) | set(out)
    else:
        n = p.penalty_last_n
        ctx = list(prompt) + list(out)
        window = [] if n == 0 else ctx if n == -1 else ctx[-n:]
        counts, repeated = Counter(window), set(window)
    for t in range(len(row)):
        if t in repeated and p.repetition_penalty != 1.0:
            row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
        c = counts.get(t, 0)
        row[t] -= c * p.frequency_penalty + (c > 0) * p.presence_penalty
    return row


CASES = [
    dict(presence_penalty=0.7),
    dict(frequency_penalty=0.4),
    dict(repetition_penalty=1.3),
    dict(repetition_penalty=0.8, frequency_penalty=-0.3, presence_penalty=1.5),
    dict(repetition_penalty=1.2, penalty_last_n=8),
    dict(frequency_penalty=0.5, presence_penalty=0.2, penalty_last_n=-1),
    dict(repetition_penalty=1.5, presence_penalty=1.0, penalty_last_n=0),
    dict(logit_bias=((3, 5.0), (7, -2.5))),
    dict(logit_bias=((1, -math.inf),), frequency_penalty=0.3, penalty_last_n=4),
]


@pytest.mark.parametrize("case", CASES)
def test_adjusted_rows_equal_the_definition(case):
    rng = random.Random(len(str(case)))
    p = SamplingParams(**case)
    prompt = [rng.randrange(V) for _ in range(30)]
    pen = Penalties(p, prompt)
    out: list[int] = []
    for _ in range(40):
        logits = torch.randn(V, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
        got = pen.adjust(logits).tolist()
        want = _expected(logits.tolist(), prompt, out, p)
        assert got == pytest.approx(want, rel=1e-6, abs=1e-6)
        token = rng.randrange(V) if rng.random() < 0.5 else rng.choice(out or prompt)
        pen.seen(token)
        out.append(token)


def test_nothing_set_changes_nothing():
    logits = torch.randn(V)
    pen = Penalties(SamplingParams(penalty_last_n=64), [1, 2, 3])
    assert not pen.active and pen.adjust(logits) is logits
    assert not Penalties(SamplingParams(repetition_penalty=2.0, penalty_last_n=0), [1]).active


def test_greedy_choice_follows_the_adjusted_row_and_logprobs_the_model():
    logits = torch.zeros(V)
    logits[4], logits[9] = 3.0, 2.0
    plain = Sampler(SamplingParams(logprobs=2))
    first = plain(logits)
    assert first.token == 4
    banned = Sampler(SamplingParams(logprobs=2, logit_bias=((4, -math.inf),)))
    s = banned(logits)
    assert s.token == 9 and s.logprob == pytest.approx(float(logits.log_softmax(-1)[9]))
    assert s.top == first.top                        # the model's own distribution
    # a frequency penalty of 2 takes token 4 below token 9 after it was chosen once
    rep = Sampler(SamplingParams(frequency_penalty=2.0))
    assert [rep(logits).token for _ in range(3)] == [4, 9, 4]


def test_sampled_draws_never_pick_a_banned_token():
    sampler = Sampler(SamplingParams(temperature=1.0, seed=3,
                                     logit_bias=tuple((t, -math.inf) for t in range(0, V, 2))))
    picks = {sampler(torch.zeros(V)).token for _ in range(200)}
    assert picks and all(t % 2 for t in picks)


def test_llama_window_forgets_old_tokens():
    p = SamplingParams(presence_penalty=1.0, penalty_last_n=3)
    pen = Penalties(p, [5, 6, 7])
    logits = torch.zeros(V)
    assert pen.adjust(logits)[5] == -1.0
    for t in (8, 9, 10):
        pen.seen(t)
    row = pen.adjust(logits)
    assert row[5] == 0.0 and row[8] == row[9] == row[10] == -1.0


@pytest.mark.parametrize("bad", [
    dict(repetition_penalty=0.0), dict(repetition_penalty=-1.0),
    dict(presence_penalty=math.nan), dict(frequency_penalty=math.inf),
    dict(penalty_last_n=-2), dict(logit_bias=((-1, 1.0),)), dict(logit_bias=((1, math.inf),)),
    dict(logit_bias=((1, "x"),)),
])
def test_bad_values_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)

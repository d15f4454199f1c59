"""Sampling parameters and the per-request sampler."""

from __future__ import annotations

import math

import pytest
import torch

from ckptd.model.sampling.sampler import Sampler, SamplingParams

PROBS = torch.tensor([0.05, 0.5, 0.15, 0.3])
LOGITS = PROBS.log()


def _logits(seed, vocab=64):
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 3


def _draws(params, logits, n):
    s = Sampler(params)
    return [s(logits).token for _ in range(n)]


def test_temperature_zero_and_top_k_one_are_greedy():
    for seed in range(5):
        row = _logits(seed)
        best = int(row.argmax())
        assert Sampler(SamplingParams(temperature=0.0, top_p=0.5, min_p=0.2))(row).token == best
        assert _draws(SamplingParams(temperature=2.0, top_k=1, seed=seed), row, 5) == [best] * 5


def test_seeded_draws_repeat_and_seeds_differ():
    row = _logits(0)
    a = _draws(SamplingParams(temperature=1.5, seed=3), row, 30)
    assert a == _draws(SamplingParams(temperature=1.5, seed=3), row, 30)
    assert a != _draws(SamplingParams(temperature=1.5, seed=4), row, 30)
    assert len(set(a)) > 3                                  # really sampling


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    def kept(top_p):
        p = Sampler(SamplingParams(temperature=1.0, top_p=top_p)).probs(LOGITS)
        return set(torch.nonzero(p).flatten().tolist())

    assert kept(0.4) == {1}
    assert kept(0.5) == {1}                # 0.5 alone reaches 0.5
    assert kept(0.51) == {1, 3}
    assert kept(0.8) == {1, 3}
    assert kept(0.81) == {1, 3, 2}
    assert kept(1.0) == {0, 1, 2, 3}
    p = Sampler(SamplingParams(temperature=1.0, top_p=0.8)).probs(LOGITS)
    assert p[1].item() == pytest.approx(0.5 / 0.8) and p[3].item() == pytest.approx(0.3 / 0.8)


def test_top_k_min_p_and_temperature_shape_the_distribution():
    probs = Sampler(SamplingParams(temperature=1.0, top_k=2)).probs(LOGITS)
    assert torch.allclose(probs, torch.tensor([0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8]))
    probs = Sampler(SamplingParams(temperature=1.0, min_p=0.5)).probs(LOGITS)
    assert set(torch.nonzero(probs).flatten().tolist()) == {1, 3}   # >= 0.25 = 0.5 * max
    hot = Sampler(SamplingParams(temperature=100.0)).probs(LOGITS)
    cold = Sampler(SamplingParams(temperature=0.1)).probs(LOGITS)
    assert hot.max() - hot.min() < 0.01 and cold[1] > 0.99


def test_draws_follow_the_distribution():
    n = 4000
    draws = _draws(SamplingParams(temperature=1.0, top_p=0.8, seed=0), LOGITS, n)
    freq = torch.bincount(torch.tensor(draws), minlength=4).float() / n
    assert freq[0] == 0 and freq[2] == 0
    assert abs(freq[1].item() - 0.625) < 0.03 and abs(freq[3].item() - 0.375) < 0.03


def test_logprobs():
    row = _logits(1)
    lp = row.log_softmax(-1)
    out = Sampler(SamplingParams(logprobs=3))(row)
    assert out.token == int(row.argmax())
    assert out.logprob == pytest.approx(lp.max().item())
    assert [t for t, _ in out.top] == lp.topk(3).indices.tolist()
    assert all(a >= b for (_, a), (_, b) in zip(out.top, out.top[1:]))
    out = Sampler(SamplingParams(temperature=1.0, seed=2, logprobs=0))(row)
    assert out.top == [] and out.logprob == pytest.approx(lp[out.token].item())
    assert Sampler(SamplingParams())(row).logprob is None


def test_params_normalize_stop_lists():
    p = SamplingParams(stop="END", stop_token_ids=[5, 6])
    assert p.stop == ("END",) and p.stop_token_ids == (5, 6)
    assert SamplingParams(stop=["a", "bc"]).stop == ("a", "bc")
    assert hash(p) == hash(SamplingParams(stop=("END",), stop_token_ids=(5, 6)))


@pytest.mark.parametrize("bad", [
    dict(max_tokens=-1), dict(max_tokens=2.5), dict(max_tokens=True),
    dict(temperature=-0.1), dict(temperature=math.inf), dict(temperature=math.nan),
    dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=-0.1), dict(min_p=2.0),
    dict(seed=-3), dict(seed="7"), dict(logprobs=-1), dict(logprobs=21),
    dict(stop=("",)), dict(stop=(3,)), dict(stop_token_ids=(-1,)),
])
def test_invalid_params_raise_value_error(bad):
    with pytest.raises(ValueError, match=next(iter(bad)).split("_")[0]):
        SamplingParams(**bad)

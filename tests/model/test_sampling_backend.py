"""Backend sampling (model/sampling/backend.py) against the host path (sampler.py): the
same tokens and reported probabilities for the same seed, rows of different requests
batched together."""

from __future__ import annotations

import pytest
import torch

from ckptd.model.sampling import backend
from ckptd.model.sampling.sampler import Sampler, SamplingParams

V = 500


def _logits(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # peaked rows, so that top-p and min-p cut somewhere inside the vocabulary
    return torch.randn(n, V, generator=g) * 3.0


PARAMS = [
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=4242,
                   logprobs=10, post_sampling_probs=True),                # llama-server's
    SamplingParams(temperature=1.0, seed=1, logprobs=5),                  # logprobs
    SamplingParams(temperature=0.0, seed=2, logprobs=3, post_sampling_probs=True),  # greedy
    SamplingParams(temperature=1.3, top_p=0.5, seed=3, min_keep=4),
    SamplingParams(temperature=0.7, min_p=0.2, top_k=7, seed=5,
                   samplers=("min_p", "temperature", "top_k"), logprobs=4,
                   post_sampling_probs=True),                             # llama.cpp order
    SamplingParams(temperature=1.0, seed=6, logit_bias=((3, 50.0), (4, float("-inf")))),
    SamplingParams(temperature=0.9, top_k=1, seed=7),                     # top-k 1: greedy
]


def _same(a, b) -> None:
    assert a.token == b.token
    assert (a.logprob is None) == (b.logprob is None)
    if a.logprob is not None:
        assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
    if b.prob is not None:
        assert a.prob == pytest.approx(b.prob, abs=1e-5)
    assert [t for t, _ in a.top] == [t for t, _ in b.top]
    for (_, x), (_, y) in zip(a.top, b.top):
        assert x == pytest.approx(y, abs=1e-5)


def test_backend_draws_what_the_host_draws():
    host = [Sampler(p) for p in PARAMS]
    dev = [Sampler(p) for p in PARAMS]
    assert all(backend.supports(s) for s in dev)
    for step in range(12):           # the generators advance alike, step after step
        x = _logits(len(PARAMS), step)
        got = backend.sample(dev, x)
        for i, s in enumerate(host):
            _same(got[i], s(x[i]))


def test_seeded_draws_differ_between_seeds():
    x = _logits(1, 99)
    toks = {tuple(backend.sample([s], x)[0].token for _ in range(8))
            for s in (Sampler(SamplingParams(temperature=1.5, seed=k)) for k in range(4))}
    assert len(toks) > 1


def test_post_sampling_probs_sum_to_one_and_skip_zeros():
    p = SamplingParams(temperature=1.0, top_k=3, seed=0, logprobs=10, post_sampling_probs=True)
    s = backend.sample([Sampler(p)], _logits(1, 5))[0]
    assert len(s.top) == 3 and sum(v for _, v in s.top) == pytest.approx(1.0, abs=1e-5)


def test_chains_it_cannot_run_go_to_the_host():
    for p in (SamplingParams(temperature=1.0, repetition_penalty=1.1),
              SamplingParams(temperature=1.0, typical_p=0.5),
              SamplingParams(temperature=1.0, top_n_sigma=1.0),
              SamplingParams(temperature=1.0, xtc_probability=0.5),
              SamplingParams(temperature=1.0, dynatemp_range=0.5),
              SamplingParams(temperature=1.0, mirostat=2)):
        assert not backend.supports(Sampler(p)), p


def test_rows_and_samplers_must_match():
    with pytest.raises(ValueError, match="one logits row per sampler"):
        backend.sample([Sampler(SamplingParams())], _logits(2))

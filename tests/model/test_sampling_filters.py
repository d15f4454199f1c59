"""llama.cpp's other filters (model/sampling/filters.py) against their definitions written
out here in numpy, and the order a request names."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ckptd.model.sampling import filters
from ckptd.model.sampling.sampler import SamplingParams

GEN = torch.Generator()


def _row(seed: int, vocab: int = 50) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 2


def _kept(x: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(x)).flatten().tolist())


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("typical", [0.2, 0.5, 0.9])
def test_typical_keeps_the_tokens_nearest_the_entropy(seed, typical):
    row = _row(seed)
    p = _softmax(row.double().numpy())
    entropy = -(p * np.log(p)).sum()
    order = np.argsort(np.abs(-np.log(p) - entropy), kind="stable")
    want, mass = set(), 0.0
    for i in order:                 # until the mass passes typical_p, that token included
        want.add(int(i))
        mass += p[i]
        if mass > typical:
            break
    got = filters.typ_p(row, SamplingParams(typical_p=typical), GEN)
    assert _kept(got) == want


@pytest.mark.parametrize("n", [0.5, 1.0, 2.0])
def test_top_n_sigma_keeps_logits_within_n_deviations_of_the_largest(n):
    row = _row(1)
    x = row.double().numpy()
    want = {i for i, v in enumerate(x) if v >= x.max() - n * x.std()}
    assert _kept(filters.top_n_sigma(row, SamplingParams(top_n_sigma=n), GEN)) == want
    assert torch.equal(filters.top_n_sigma(row, SamplingParams(), GEN), row)   # -1: off


def test_xtc_drops_every_likely_token_but_the_least_of_them():
    probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    p = SamplingParams(xtc_probability=1.0, xtc_threshold=0.12)
    assert _kept(filters.xtc(probs.log(), p, GEN)) == {2, 3, 4}
    one_above = SamplingParams(xtc_probability=1.0, xtc_threshold=0.35)
    assert _kept(filters.xtc(probs.log(), one_above, GEN)) == {0, 1, 2, 3, 4}
    keep4 = SamplingParams(xtc_probability=1.0, xtc_threshold=0.12, min_keep=4)
    assert _kept(filters.xtc(probs.log(), keep4, GEN)) == {0, 1, 2, 3, 4}


def test_dynamic_temperature_follows_the_entropy():
    flat = torch.zeros(8)                     # normalized entropy 1: the top of the range
    p = SamplingParams(temperature=1.0, dynatemp_range=0.5)
    assert torch.allclose(filters.temperature(flat + 3.0, p, GEN), (flat + 3.0) / 1.5)
    peaked = torch.tensor([0.0] + [-1e4] * 7)  # entropy 0: the bottom
    assert torch.allclose(filters.temperature(peaked, p, GEN), peaked / 0.5)
    row = _row(2)
    assert torch.allclose(filters.temperature(row, SamplingParams(temperature=0.7), GEN),
                          row / 0.7)


def test_min_keep_holds_for_the_cutting_filters():
    row = _row(3)
    for cut in ({"top_p": 0.01}, {"min_p": 0.99}, {"top_k": 2}, {"typical_p": 0.01}):
        params = SamplingParams(temperature=1.0, min_keep=5, **cut)
        assert len(_kept(filters.chain(row, params, GEN).log())) >= 5, cut
        assert len(_kept(filters.chain(row, SamplingParams(temperature=1.0, **cut),
                                       GEN).log())) < 5, cut


def test_default_chain_is_the_former_sampler():
    """temperature, top-k, top-p, min-p as ckptd sampled before the other filters."""
    for seed in range(5):
        row = _row(seed)
        p = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05)
        scaled = row / 0.8
        kth = torch.topk(scaled, 20).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = scaled.softmax(-1)
        sp, order = probs.sort(descending=True)
        probs[order[sp.cumsum(-1) - sp >= 0.9]] = 0.0
        probs = probs.masked_fill(probs < 0.05 * probs.max(), 0.0)
        assert torch.allclose(filters.chain(row, p, GEN), probs / probs.sum(), atol=1e-6)


def test_a_request_order_runs_only_what_it_names():
    row = _row(4)
    only_k = SamplingParams(temperature=5.0, top_k=3, samplers=("top_k",))
    kth = torch.topk(row, 3).values[-1]
    want = row.masked_fill(row < kth, float("-inf")).softmax(-1)    # no temperature
    assert torch.allclose(filters.chain(row, only_k, GEN), want)
    # min-p before temperature keeps another set than after it
    before = SamplingParams(temperature=3.0, min_p=0.3, samplers=("min_p", "temperature"))
    after = SamplingParams(temperature=3.0, min_p=0.3, samplers=("temperature", "min_p"))
    assert _kept(filters.chain(row, before, GEN).log()) != \
        _kept(filters.chain(row, after, GEN).log())
    assert filters.sampler_name("Top-K") == "top_k" and filters.sampler_name("nucleus") == \
        "top_p" and filters.sampler_name("nope") is None
    with pytest.raises(ValueError, match="samplers"):
        SamplingParams(samplers=("top_k", "nope"))
    assert math.isclose(float(filters.chain(row, SamplingParams(temperature=1.0), GEN).sum()), 1.0,
                        rel_tol=1e-6)

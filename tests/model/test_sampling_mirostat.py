"""Mirostat (model/sampling/mirostat.py) against llama.cpp's loops written out here in
plain Python, and the property it exists for: the drawn tokens' mean surprise settles
at tau."""

from __future__ import annotations

import math

import pytest
import torch

from ckptd.model.sampling.mirostat import TOP_M, Mirostat
from ckptd.model.sampling.sampler import Sampler, SamplingParams


def _zipf(vocab: int = 400, s: float = 1.1) -> torch.Tensor:
    """Logits of a Zipf distribution (what mirostat's derivation assumes), shuffled."""
    ranks = torch.arange(1, vocab + 1, dtype=torch.float32)
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))
    return (-s * ranks.log())[perm]


def _sorted_probs(x: torch.Tensor) -> list[float]:
    return sorted(x.softmax(-1).tolist(), reverse=True)


def _v2_kept(x: torch.Tensor, mu: float) -> int:
    p = _sorted_probs(x)
    n = next((i for i, q in enumerate(p) if -math.log2(q) > mu), len(p))
    return max(n, 1)


def _v1_kept(x: torch.Tensor, mu: float, m: int = TOP_M) -> int:
    p = _sorted_probs(x)
    sum_tb = sum_tt = 0.0
    for i in range(min(m - 1, len(p) - 1)):
        t = math.log((i + 2) / (i + 1))
        sum_tb += t * math.log(p[i] / p[i + 1])
        sum_tt += t * t
    s_hat = sum_tb / sum_tt
    eps = s_hat - 1
    k = ((eps * 2 ** mu) / (1 - len(p) ** -eps)) ** (1 / s_hat)
    return max(min(int(k), len(p)), 1)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("tau", [2.0, 4.0, 6.0])
def test_kept_tokens_are_llama_cpps(version, tau):
    x = _zipf()
    m = Mirostat(version, tau, 0.1)
    for mu in (tau, 2 * tau, 1.5 * tau):
        m.mu = mu
        probs = m.probs(x)
        kept = int((probs > 0).sum())
        want = _v2_kept(x, mu) if version == 2 else _v1_kept(x, mu)
        assert abs(kept - want) <= (0 if version == 2 else 1), (mu, kept, want)
        assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-5)
        top = set(x.topk(kept).indices.tolist())             # the most likely ones
        assert set(torch.nonzero(probs).flatten().tolist()) == top


def test_mu_moves_by_eta_times_the_surprise_error():
    m = Mirostat(2, 3.0, 0.25)
    m.observe(0.5)                                      # surprise 1 bit
    assert m.mu == pytest.approx(6.0 - 0.25 * (1.0 - 3.0))
    m.observe(1 / 64)                                   # 6 bits
    assert m.mu == pytest.approx(6.5 - 0.25 * (6.0 - 3.0))


@pytest.mark.parametrize("version", [1, 2])
def test_mean_surprise_settles_at_tau(version):
    """Drawn from a fixed distribution, the tokens' surprise (in the kept distribution)
    averages tau: mirostat's whole purpose."""
    tau = 3.0
    params = SamplingParams(temperature=1.0, seed=5, mirostat=version, mirostat_tau=tau,
                            mirostat_eta=0.1)
    s = Sampler(params)
    x = _zipf()
    seen = []
    for _ in range(600):
        tok = s(x).token
        seen.append(-math.log2(float(s.drawn[tok])))
    mean = sum(seen[100:]) / len(seen[100:])
    assert abs(mean - tau) < 0.35, mean


def test_seeded_runs_repeat_and_probabilities_are_the_draws():
    params = SamplingParams(temperature=0.8, seed=9, mirostat=2, logprobs=3,
                            post_sampling_probs=True)
    a, b = Sampler(params), Sampler(params)
    x = _zipf()
    ra = [a(x) for _ in range(30)]
    rb = [b(x) for _ in range(30)]
    assert [r.token for r in ra] == [r.token for r in rb]
    for r in ra:                    # the reported probability is the kept distribution's
        assert 0 < r.prob <= 1 and r.top[0][1] >= r.prob - 1e-6


@pytest.mark.parametrize("bad", [{"mirostat": 3}, {"mirostat_tau": -1.0},
                                 {"mirostat_eta": float("nan")}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)

"""The filters a draw samples through. Each takes a logits row [vocab] (fp32, -inf for
the tokens already out) and returns it with more tokens at -inf (temperature rescales
it instead); `chain` runs them in a request's order (llama.cpp's `samplers` field) or
ckptd's.

Names and definitions follow llama.cpp (src/llama-sampler.cpp): min_keep is the
fewest tokens a cutting filter leaves; typical sampling keeps the tokens whose
surprisal is nearest the entropy until their mass reaches typical_p; top-n-sigma
keeps logits within n standard deviations of the largest; XTC, with probability
xtc_probability, drops every token at or above xtc_threshold but the least likely of
them; dynamic temperature maps the distribution's normalized entropy into
[T - range, T + range].
"""

from __future__ import annotations

import math

import torch

# ckptd's order (temperature first, as OpenAI's and vLLM's samplers apply it); a
# request's `samplers` list replaces it, and names what runs: a filter left out of the
# list does not run, as in llama.cpp.
DEFAULT = ("temperature", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc")
# llama.cpp's names (and its one-letter forms); "penalties" and "dry" run before this
# chain (sampler.py: a list without them turns them off), "adaptive_p" not at all
# (sampling.py refuses it on), so they are accepted in a list and skipped here.
_CANONICAL = ("top_k", "top_p", "min_p", "typ_p", "top_n_sigma", "xtc", "temperature",
              "penalties", "dry", "adaptive_p", "infill")
CHARS = {"k": "top_k", "p": "top_p", "m": "min_p", "y": "typ_p", "s": "top_n_sigma",
         "x": "xtc", "t": "temperature", "e": "penalties", "d": "dry", "a": "adaptive_p",
         "i": "infill"}
_ALIASES = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p", "typical_p": "typ_p"}
for _name in _CANONICAL:
    _ALIASES[_name] = _name
    _ALIASES[_name.replace("_", "-")] = _name
    _ALIASES[_name.replace("_", "")] = _name


def sampler_name(name: str) -> str | None:
    """The canonical name of a sampler as llama.cpp spells it (top-k, topk, nucleus...)."""
    return _ALIASES.get(name.lower())


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return x.softmax(-1)


def _keep_top(x: torch.Tensor, keep: torch.Tensor, order: torch.Tensor,
              min_keep: int) -> torch.Tensor:
    """x with the tokens not in `keep` at -inf; `keep` is over `order` (positions in
    sorted order), and the first min_keep of `order` always stay."""
    if min_keep:
        keep[:min_keep] = True
    out = torch.full_like(x, float("-inf"))
    idx = order[keep]
    out[idx] = x[idx]
    return out


def temperature(x: torch.Tensor, p, gen) -> torch.Tensor:
    t = p.temperature
    if p.dynatemp_range > 0.0:
        lo, hi = max(0.0, t - p.dynatemp_range), t + p.dynatemp_range
        probs = _softmax(x)
        n = int(torch.isfinite(x).sum())
        if n > 1:
            nz = probs[probs > 0]
            entropy = float(-(nz * nz.log()).sum())
            t = lo + (hi - lo) * (entropy / math.log(n)) ** p.dynatemp_exponent
    return x / max(t, 1e-6)


def top_k(x: torch.Tensor, p, gen) -> torch.Tensor:
    k = max(p.top_k, p.min_keep) if p.top_k > 0 else 0
    if k <= 0 or k >= x.numel():
        return x
    kth = torch.topk(x, k).values[-1]
    return x.masked_fill(x < kth, float("-inf"))


def top_p(x: torch.Tensor, p, gen) -> torch.Tensor:
    if p.top_p >= 1.0:
        return x
    probs, order = _softmax(x).sort(descending=True)
    # the smallest set of most likely tokens whose mass reaches top_p: a token goes when
    # the mass before it already does (the first always stays)
    keep = probs.cumsum(-1) - probs < p.top_p
    return _keep_top(x, keep, order, p.min_keep)


def min_p(x: torch.Tensor, p, gen) -> torch.Tensor:
    if p.min_p <= 0.0:
        return x
    probs, order = _softmax(x).sort(descending=True)
    return _keep_top(x, probs >= p.min_p * probs[0], order, p.min_keep)


def typ_p(x: torch.Tensor, p, gen) -> torch.Tensor:
    if p.typical_p >= 1.0:
        return x
    logp = x.log_softmax(-1)
    probs = logp.exp()
    finite = torch.isfinite(logp)
    entropy = -(probs[finite] * logp[finite]).sum()
    score = torch.where(finite, (-logp - entropy).abs(), torch.full_like(x, float("inf")))
    order = score.argsort()
    mass = probs[order].cumsum(-1)
    # keep tokens until the mass passes typical_p, the one that passes it included
    keep = mass - probs[order] <= p.typical_p
    keep &= finite[order]
    return _keep_top(x, keep, order, p.min_keep)


def top_n_sigma(x: torch.Tensor, p, gen) -> torch.Tensor:
    if p.top_n_sigma <= 0.0:
        return x
    finite = x[torch.isfinite(x)]
    if finite.numel() < 2:
        return x
    sigma = float(((finite - finite.mean()) ** 2).mean().sqrt())
    return x.masked_fill(x < finite.max() - p.top_n_sigma * sigma, float("-inf"))


def xtc(x: torch.Tensor, p, gen) -> torch.Tensor:
    if p.xtc_probability <= 0.0 or p.xtc_threshold > 0.5:
        return x
    if float(torch.rand((), generator=gen)) >= p.xtc_probability:
        return x
    probs, order = _softmax(x).sort(descending=True)
    above = int((probs >= p.xtc_threshold).sum())
    left = int((probs > 0).sum()) - (above - 1)
    if above < 2 or left < max(p.min_keep, 1):
        return x
    return x.index_fill(0, order[:above - 1], float("-inf"))


FILTERS = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p,
           "typ_p": typ_p, "top_n_sigma": top_n_sigma, "xtc": xtc}


def chain(logits: torch.Tensor, p, gen: torch.Generator) -> torch.Tensor:
    """The distribution a non-greedy draw samples from: [vocab], sums to 1."""
    x = logits.detach().float().cpu()
    for name in p.samplers or DEFAULT:
        f = FILTERS.get(name)
        if f is not None:
            x = f(x, p, gen)
    probs = _softmax(x)
    return probs / probs.sum()

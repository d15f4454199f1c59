"""Backend sampling (llama-server's `--backend-sampling`): a step's rows sampled where
the model ran, so only the chosen tokens and the few probabilities a request reports
leave the device, not a [vocab] logits row per sequence.

It runs the host path's operations (sampler.py, filters.py) batched over the rows:
logit bias, then temperature, top-k, top-p and min-p in the request's order, the
exponential race for the draw, and `n_probs` (logprobs of the model's distribution, or
post-sampling probabilities) computed on the device. The race's noise comes from the
request's own generator on the host, the same numbers the host path draws, so a seeded
request gets the same tokens either way; on a GPU that noise is the one [vocab] copy
to the device per row.

A request whose sampler chain needs more (penalties, DRY, a grammar, mirostat, typical,
top-n-sigma, XTC, dynamic temperature) is sampled on the host, as llama.cpp falls back
when a sampler has no backend implementation.
"""

from __future__ import annotations

import torch

from ckptd.model.sampling import filters
from ckptd.model.sampling.sampler import Sampled, Sampler, SamplingParams

# what this sampler implements; the rest of filters.DEFAULT must be off (supports())
_FILTERS = ("temperature", "top_k", "top_p", "min_p")


def supports(sampler: Sampler) -> bool:
    """Whether this request's whole chain runs here (else: the host path)."""
    p = sampler.params
    return (not sampler.penalties.penalize and sampler.dry is None and
            sampler.matcher is None and sampler.mirostat is None and
            p.dynatemp_range <= 0.0 and p.typical_p >= 1.0 and p.top_n_sigma <= 0.0 and
            (p.xtc_probability <= 0.0 or p.xtc_threshold > 0.5))


def sample(samplers: list[Sampler], logits: torch.Tensor) -> list[Sampled]:
    """One token for each row of logits [n, vocab] (on any device), row i with
    samplers[i]; each sampler's state (its generator, counts) advances as on the host."""
    if logits.dim() != 2 or logits.shape[0] != len(samplers):
        raise ValueError(f"need one logits row per sampler, got {tuple(logits.shape)} for "
                         f"{len(samplers)}")
    raw = logits.detach().float()
    x = _biased(samplers, raw)
    greedy = [s.params.greedy for s in samplers]
    probs = _filtered(samplers, x, greedy)
    tokens = _draw(samplers, x, probs, greedy)
    out = _report(samplers, raw, probs, tokens, greedy)
    for s, sp in zip(samplers, out):
        s.penalties.seen(sp.token)
    return out


def _biased(samplers: list[Sampler], raw: torch.Tensor) -> torch.Tensor:
    """The rows with each request's logit bias added, as Penalties.adjust adds it."""
    if not any(s.params.logit_bias for s in samplers):
        return raw
    x = raw.clone()
    V = x.shape[1]
    for i, s in enumerate(samplers):
        pairs = [(t, b) for t, b in s.params.logit_bias if t < V]
        if pairs:
            ids = torch.tensor([t for t, _ in pairs], dtype=torch.long, device=x.device)
            row = x[i]
            row[ids] += torch.tensor([b for _, b in pairs], dtype=x.dtype, device=x.device)
    return x


def _filtered(samplers: list[Sampler], x: torch.Tensor, greedy: list[bool]) -> torch.Tensor:
    """The distribution each non-greedy row draws from (greedy rows: unused zeros)."""
    probs = torch.zeros_like(x)
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, s in enumerate(samplers):
        if not greedy[i]:
            order = tuple(n for n in (s.params.samplers or filters.DEFAULT) if n in _FILTERS)
            groups.setdefault(order, []).append(i)
    for order, rows in groups.items():
        idx = torch.tensor(rows, dtype=torch.long, device=x.device)
        params = [samplers[i].params for i in rows]
        y = x.index_select(0, idx)
        for name in order:
            y = _STEPS[name](y, params)
        p = y.softmax(-1)
        probs.index_copy_(0, idx, p / p.sum(-1, keepdim=True))
    return probs


def _column(params: list[SamplingParams], name: str, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor([float(getattr(p, name)) for p in params], dtype=like.dtype,
                        device=like.device).unsqueeze(1)


def _temperature(y: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    t = torch.tensor([max(p.temperature, 1e-6) for p in params], dtype=y.dtype,
                     device=y.device).unsqueeze(1)
    return y / t


def _top_k(y: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    V = y.shape[1]
    ks = [max(p.top_k, p.min_keep) if p.top_k > 0 else 0 for p in params]
    on = [0 < k < V for k in ks]
    if not any(on):
        return y
    kmax = max(k for k, o in zip(ks, on) if o)
    top = torch.topk(y, kmax, dim=-1).values
    at = torch.tensor([k - 1 if o else 0 for k, o in zip(ks, on)], device=y.device)
    kth = top.gather(1, at.unsqueeze(1))
    cut = (y < kth) & torch.tensor(on, device=y.device).unsqueeze(1)
    return y.masked_fill(cut, float("-inf"))


def _sorted_cut(y: torch.Tensor, params: list[SamplingParams], keep_fn) -> torch.Tensor:
    """y with the tokens keep_fn(sorted probs) drops at -inf; the first min_keep of the
    sorted order always stay (filters._keep_top, row by row)."""
    probs, order = y.softmax(-1).sort(dim=-1, descending=True)
    keep = keep_fn(probs)
    mk = torch.tensor([p.min_keep for p in params], device=y.device).unsqueeze(1)
    keep |= torch.arange(y.shape[1], device=y.device).unsqueeze(0) < mk
    drop = torch.zeros_like(keep).scatter_(1, order, ~keep)
    return y.masked_fill(drop, float("-inf"))


def _top_p(y: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    if all(p.top_p >= 1.0 for p in params):
        return y
    top_p = _column(params, "top_p", y)
    on = top_p < 1.0
    return _sorted_cut(y, params, lambda s: (s.cumsum(-1) - s < top_p) | ~on)


def _min_p(y: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    if all(p.min_p <= 0.0 for p in params):
        return y
    min_p = _column(params, "min_p", y)
    on = min_p > 0.0
    return _sorted_cut(y, params, lambda s: (s >= min_p * s[:, :1]) | ~on)


_STEPS = {"temperature": _temperature, "top_k": _top_k, "top_p": _top_p, "min_p": _min_p}


def _draw(samplers: list[Sampler], x: torch.Tensor, probs: torch.Tensor,
          greedy: list[bool]) -> torch.Tensor:
    """argmax for greedy rows, the exponential race (sampler._draw) for the others."""
    tokens = x.argmax(-1)
    drawn = [i for i, g in enumerate(greedy) if not g]
    if drawn:
        V = x.shape[1]
        race = torch.stack([torch.empty(V, dtype=torch.float32).exponential_(
            generator=samplers[i].gen) for i in drawn]).to(x.device, non_blocking=True)
        idx = torch.tensor(drawn, dtype=torch.long, device=x.device)
        tokens.index_copy_(0, idx, (probs.index_select(0, idx) / race).argmax(-1))
    return tokens


def _report(samplers: list[Sampler], raw: torch.Tensor, probs: torch.Tensor,
            tokens: torch.Tensor, greedy: list[bool]) -> list[Sampled]:
    """Sampled per row: the token, and what n_probs asks, reduced on the device."""
    n = max((s.params.logprobs or 0) for s in samplers)
    want = [s.params.logprobs is not None for s in samplers]
    post = [s.params.post_sampling_probs for s in samplers]
    rows = tokens.unsqueeze(1)
    lp_tok = lp_top = pp_tok = pp_top = None
    if any(w and not q for w, q in zip(want, post)):
        lp = raw.log_softmax(-1)
        lp_tok = lp.gather(1, rows).squeeze(1).tolist()
        lp_top = _host(lp.topk(n, dim=-1)) if n else None
    if any(w and q for w, q in zip(want, post)):
        # a greedy row's distribution is all on its token (sampler._post)
        onehot = torch.zeros_like(probs).scatter_(1, rows, 1.0)
        g = torch.tensor(greedy, device=probs.device).unsqueeze(1)
        dist = torch.where(g, onehot, probs)
        pp_tok = dist.gather(1, rows).squeeze(1).tolist()
        pp_top = _host(dist.topk(n, dim=-1)) if n else None
    out = []
    for i, (s, token) in enumerate(zip(samplers, tokens.tolist())):
        k = s.params.logprobs or 0
        if not want[i]:
            out.append(Sampled(token))
        elif post[i]:
            top = _pairs(pp_top, i, k)
            out.append(Sampled(token, None, [(t, v) for t, v in top if v > 0.0], pp_tok[i]))
        else:
            out.append(Sampled(token, lp_tok[i], _pairs(lp_top, i, k)))
    return out


def _host(top) -> tuple[list[list[int]], list[list[float]]]:
    """A batch's top-n (ids, values) as lists: one copy off the device."""
    return top.indices.tolist(), top.values.tolist()


def _pairs(top, i: int, k: int) -> list[tuple[int, float]]:
    if top is None or not k:
        return []
    ids, vals = top
    return list(zip(ids[i][:k], vals[i][:k]))

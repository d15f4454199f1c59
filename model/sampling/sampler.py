"""Sampling parameters and one-token sampling from a logits row.

Filters (filters.py) apply in the order vLLM uses: temperature, then top-n-sigma,
top-k, typical, top-p, min-p and XTC, unless a request names its own order
(llama.cpp's `samplers`); with mirostat on, temperature then mirostat alone
(mirostat.py). Each request has its own torch.Generator, so a seeded
request draws the same tokens whatever else shares its batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ckptd.model.sampling import filters
from ckptd.model.sampling.dry import Dry, DryParams
from ckptd.model.sampling.grammar import Compiled
from ckptd.model.sampling.mirostat import Mirostat
from ckptd.model.sampling.penalties import Penalties
from ckptd.model.speculative.params import DraftLimits

MAX_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0       # 0: greedy
    top_k: int = 0                 # 0: off
    top_p: float = 1.0             # 1: off
    min_p: float = 0.0             # 0: off
    seed: int | None = None        # None: a fresh random seed per request
    stop: tuple[str, ...] = ()     # stop strings; the text never includes them
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None    # None: off; n: the chosen token's logprob and the top n
    presence_penalty: float = 0.0  # model/sampling/penalties.py: what they count
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0     # 1: off
    penalty_last_n: int | None = None   # None: OpenAI's convention; n: llama.cpp's window
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token, added to its logit; -inf: never)
    grammar: Compiled | None = None     # constrained decoding (model/sampling/grammar.py)
    post_sampling_probs: bool = False   # report probabilities after the filters, not logprobs
    # llama.cpp's other filters (filters.py); each value here turns its filter off
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    min_keep: int = 0                   # the fewest tokens a cutting filter leaves
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    samplers: tuple[str, ...] | None = None     # the filters and their order; None: ckptd's
    mirostat: int = 0                   # 1 or 2: temperature then mirostat (mirostat.py) only
    mirostat_tau: float = 5.0           # the target surprise, in bits
    mirostat_eta: float = 0.1           # how fast mu follows the surprise seen
    dry: DryParams | None = None        # DRY (dry.py), after the penalties; None: off
    backend_sampling: bool = False      # sample on the model's device (backend.py) if it can
    draft: DraftLimits | None = None    # speculative.n_max/n_min/p_min; None: the server's

    def __post_init__(self) -> None:
        # Accept a single string and lists, as the OpenAI API does; store tuples.
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _int("max_tokens", self.max_tokens, lo=0)
        _int("top_k", self.top_k, lo=0)
        if self.seed is not None:
            _int("seed", self.seed, lo=0)
        if self.logprobs is not None:
            _int("logprobs", self.logprobs, lo=0, hi=MAX_LOGPROBS)
        _real("temperature", self.temperature, lo=0.0)
        _real("top_p", self.top_p, lo=0.0, hi=1.0)
        if self.top_p == 0.0:
            raise ValueError("top_p must be in (0, 1], got 0")
        _real("min_p", self.min_p, lo=0.0, hi=1.0)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must hold non-empty strings, got {self.stop!r}")
        for t in self.stop_token_ids:
            _int("stop_token_ids", t, lo=0)
        _real("presence_penalty", self.presence_penalty, lo=-math.inf)
        _real("frequency_penalty", self.frequency_penalty, lo=-math.inf)
        _real("repetition_penalty", self.repetition_penalty, lo=0.0)
        if self.repetition_penalty == 0.0:
            raise ValueError("repetition_penalty must be > 0, got 0")
        if self.penalty_last_n is not None:
            _int("penalty_last_n", self.penalty_last_n, lo=-1)
        _real("typical_p", self.typical_p, lo=0.0, hi=1.0)
        _real("top_n_sigma", self.top_n_sigma, lo=-math.inf)
        _int("min_keep", self.min_keep, lo=0)
        _real("xtc_probability", self.xtc_probability, lo=0.0, hi=1.0)
        _real("xtc_threshold", self.xtc_threshold, lo=0.0, hi=1.0)
        _real("dynatemp_range", self.dynatemp_range, lo=0.0)
        _real("dynatemp_exponent", self.dynatemp_exponent, lo=0.0)
        _int("mirostat", self.mirostat, lo=0, hi=2)
        _real("mirostat_tau", self.mirostat_tau, lo=0.0)
        _real("mirostat_eta", self.mirostat_eta, lo=0.0)
        if self.samplers is not None:
            names = tuple(self.samplers)
            object.__setattr__(self, "samplers", names)
            unknown = [n for n in names if n not in filters.FILTERS and
                       filters.sampler_name(n) != n]
            if unknown:
                raise ValueError(f"samplers: unknown sampler {unknown[0]!r}")
        bias = tuple((t, b) for t, b in self.logit_bias)
        object.__setattr__(self, "logit_bias", bias)
        for t, b in bias:
            _int("logit_bias token", t, lo=0)
            if isinstance(b, bool) or not isinstance(b, (int, float)) or b != b or b == math.inf:
                raise ValueError(f"logit_bias of token {t} must be a number or -inf, got {b!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def _int(name: str, v, lo: int, hi: int | None = None) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {bound}, got {v}")


def _real(name: str, v, lo: float, hi: float | None = None) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {bound}, got {v}")


@dataclass
class Sampled:
    token: int
    logprob: float | None = None                            # of the model's distribution
    top: list[tuple[int, float]] = field(default_factory=list)  # (token, logprob), best first
    prob: float | None = None       # post_sampling_probs: of the distribution drawn from


class Sampler:
    """Per-request sampler: its own generator, seeded from params.seed."""

    def __init__(self, params: SamplingParams, prompt: list[int] = ()) -> None:
        self.params = params
        self.penalties = Penalties(params, prompt)
        # a request's own `samplers` list runs DRY only when it names it (llama.cpp)
        use_dry = params.dry is not None and params.dry.active and \
            (params.samplers is None or "dry" in params.samplers)
        self.dry = Dry(params.dry, prompt) if use_dry else None
        self.matcher = None if params.grammar is None else params.grammar.matcher()
        self.mirostat = None if not params.mirostat else \
            Mirostat(params.mirostat, params.mirostat_tau, params.mirostat_eta)
        self.drawn: torch.Tensor | None = None    # the distribution of the last draw
        self.gen = torch.Generator()
        if params.seed is not None:
            self.gen.manual_seed(params.seed)
        else:
            self.gen.seed()

    def __call__(self, logits: torch.Tensor, forced: int | None = None) -> Sampled:
        """One token from logits [vocab], after logit bias and penalties. Logprobs are
        those of the model's distribution (before bias, penalties, temperature and
        filters), as the OpenAI API reports them. forced: the draw is made (the seeded
        stream moves on as it would) but this token is taken instead, and the grammar
        does not advance: llama.cpp's synthetic acceptance of a drafted token."""
        p = self.params
        logits = logits.detach().float().cpu()
        adjusted = self.penalties.adjust(logits)
        if self.dry is not None:
            adjusted = self.dry.adjust(adjusted)
        if self.matcher is not None:
            adjusted = self.matcher.mask(adjusted)
        token = int(adjusted.argmax()) if p.greedy else self._draw(adjusted)
        if forced is not None:
            token = forced
        self.penalties.seen(token)
        if self.dry is not None:
            self.dry.seen(token)
        if self.matcher is not None and forced is None:
            self.matcher.accept(token)
        if p.logprobs is None:
            return Sampled(token)
        if p.post_sampling_probs:
            return self._post(adjusted, token)
        lp = logits.log_softmax(-1)
        top = []
        if p.logprobs:
            vals, ids = lp.topk(min(p.logprobs, lp.numel()))
            top = list(zip(ids.tolist(), vals.tolist()))
        return Sampled(token, float(lp[token]), top)

    @property
    def grammar_done(self) -> bool:
        return self.matcher is not None and self.matcher.done

    def _post(self, adjusted: torch.Tensor, token: int) -> Sampled:
        """The chosen token's probability and the top ones of the distribution it was drawn
        from (after bias, penalties, grammar, temperature and filters), none at 0."""
        if self.params.greedy or self.drawn is None:
            probs = torch.zeros_like(adjusted)
            probs[token] = 1.0
        else:                 # the draw's own (XTC's coin and mirostat's mu were spent)
            probs = self.drawn
        top = []
        if self.params.logprobs:
            vals, ids = probs.topk(min(self.params.logprobs, probs.numel()))
            top = [(i, v) for i, v in zip(ids.tolist(), vals.tolist()) if v > 0.0]
        return Sampled(token, None, top, float(probs[token]))

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution a non-greedy draw samples from: [vocab], sums to 1."""
        if self.mirostat is not None:
            x = filters.temperature(logits.detach().float().cpu(), self.params, self.gen)
            return self.mirostat.probs(x)
        return filters.chain(logits, self.params, self.gen)

    def _draw(self, logits: torch.Tensor) -> int:
        # argmax(p / E) with E ~ Exp(1) draws from p (the exponential race); it uses one
        # random number per vocab entry, so a seeded stream does not depend on p's zeros.
        probs = self.probs(logits)
        race = torch.empty_like(probs).exponential_(generator=self.gen)
        token = int((probs / race).argmax())
        if self.mirostat is not None:
            self.mirostat.observe(float(probs[token]))
        self.drawn = probs
        return token

"""Sampling parameters and one-token sampling from a logits row."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0       # 0: greedy
    top_k: int = 0                 # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None    # top-n logprobs per token (0: only the chosen token's)

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop must hold non-empty strings")


@dataclass
class Sampled:
    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


class Sampler:
    """Per-request sampler: its own generator, so a seeded request gives the same tokens
    whatever else shares its batch."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.gen = torch.Generator()
        if params.seed is not None:
            self.gen.manual_seed(params.seed)
        else:
            self.gen.seed()

    def __call__(self, logits: torch.Tensor) -> Sampled:
        """logits [vocab] float32."""
        p = self.params
        logits = logits.float().cpu()
        if p.temperature == 0.0 or p.top_k == 1:
            token = int(logits.argmax())
        else:
            scaled = logits / p.temperature
            if p.top_k:
                kth = torch.topk(scaled, min(p.top_k, scaled.numel())).values[-1]
                scaled = scaled.masked_fill(scaled < kth, float("-inf"))
            probs = scaled.softmax(-1)
            if p.top_p < 1.0:
                sorted_p, order = probs.sort(descending=True)
                # keep the smallest set whose mass reaches top_p (always the first token)
                drop = sorted_p.cumsum(-1) - sorted_p >= p.top_p
                probs[order[drop]] = 0.0
            if p.min_p > 0.0:
                probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
            token = int(torch.multinomial(probs / probs.sum(), 1, generator=self.gen))
        if p.logprobs is None:
            return Sampled(token)
        lp = logits.log_softmax(-1)
        top = []
        if p.logprobs:
            vals, ids = lp.topk(p.logprobs)
            top = list(zip(ids.tolist(), vals.tolist()))
        return Sampled(token, float(lp[token]), top)

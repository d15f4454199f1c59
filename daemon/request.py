"""A generation request as the engine sees it, what it measured, and how it ended."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ckptd.cache.keys import KeyChain
from ckptd.model.sampling.decoding import Decoding
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.sequence import FinishReason, Sequence


class QueueFull(RuntimeError):
    """No room in the queue (or the engine is stopping): answered 503 + Retry-After."""


class RequestTimeout(RuntimeError):
    """The request ran past its time limit, queue included."""


class EngineError(RuntimeError):
    """The engine failed while computing the request (not the request's fault)."""


@dataclass
class Stats:
    prompt_n: int = 0
    cache_n: int = 0
    cache_tier: str | None = None
    restore_ms: float = 0.0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    queued_ms: float = 0.0

    def timings(self) -> dict:
        pp = self.prompt_n - self.cache_n
        return {
            "prompt_n": self.prompt_n, "cache_n": self.cache_n, "cache_tier": self.cache_tier,
            "restore_ms": round(self.restore_ms, 3), "prompt_ms": round(self.prompt_ms, 3),
            "prompt_per_second": round(pp / self.prompt_ms * 1000, 2) if self.prompt_ms else None,
            "predicted_n": self.predicted_n, "predicted_ms": round(self.predicted_ms, 3),
            "predicted_per_second": round(self.predicted_n / self.predicted_ms * 1000, 2)
            if self.predicted_ms else None,
            "queued_ms": round(self.queued_ms, 3),
        }


@dataclass
class Finished:
    reason: FinishReason
    stats: Stats
    error: Exception | None = None    # with reason ERROR: what went wrong

    @property
    def message(self) -> str | None:
        return None if self.error is None else str(self.error)


@dataclass(eq=False)
class Request:
    tokens: list[int]
    params: SamplingParams
    emit: Callable[[object], None]        # TokenEvent, then a final Finished; worker thread
    salt: str | None = None
    use_cache: bool = True
    timeout_s: float | None = None
    cancelled: bool = False
    chain: KeyChain | None = None         # the prompt's block keys, once hashed
    created: float = field(default_factory=time.perf_counter)
    stats: Stats = field(default_factory=Stats)


@dataclass(eq=False)
class Live:
    """A request that holds a sequence: from admission to its end."""
    req: Request
    seq: Sequence
    dec: Decoding | None = None       # made once admission succeeds
    t_prefill: float = 0.0            # admitted (restore done)
    t_decode: float = 0.0             # the prompt's last token computed; 0 before

"""A generation request as the engine sees it, what it measured, and how it ended."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ckptd.cache.keys import KeyChain
from ckptd.cache.why.report import CacheReport
from ckptd.daemon.cachefields import timings_cache
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
    draft_n: int = 0                  # tokens a draft model proposed (speculative decoding)
    draft_n_accepted: int = 0         # of them, those the model kept
    cache: CacheReport | None = None  # what the restore took from where, and why not more

    def timings(self) -> dict:
        """llama-server's timings: prompt_n counts the prompt tokens computed (cache_n
        were restored), and the decode rate is over the steps after the first token
        (which came with the prompt's last logits). Every figure is a finite number;
        ckptd adds the restore, the queue, the tier restored from (when one was) and the
        cache's report (`cache`: daemon/cachefields.py)."""
        pp, dn = self.prompt_n - self.cache_n, max(self.predicted_n - 1, 0)
        # rates from the reported (rounded) times, so a client recomputes them exactly
        pms, dms = round(self.prompt_ms, 3), round(self.predicted_ms, 3)
        out = {
            "cache_n": self.cache_n, "prompt_n": pp, "prompt_ms": pms,
            "prompt_per_token_ms": pms / pp if pp else 0.0,
            "prompt_per_second": pp / pms * 1000 if pms and pp else 0.0,
            "predicted_n": self.predicted_n, "predicted_ms": dms,
            "predicted_per_token_ms": dms / dn if dn else 0.0,
            "predicted_per_second": dn / dms * 1000 if dms and dn else 0.0,
            "restore_ms": round(self.restore_ms, 3), "queued_ms": round(self.queued_ms, 3),
        }
        if self.cache_tier is not None:
            out["cache_tier"] = self.cache_tier
        out["cache"] = timings_cache(self)
        if self.draft_n:                  # llama-server reports them when it drafted
            out["draft_n"], out["draft_n_accepted"] = self.draft_n, self.draft_n_accepted
        return out


@dataclass
class Progress:
    """A prompt's progress, after each prefill chunk (requests that ask for it):
    llama-server's prompt_progress. `cache` tokens were restored, `processed` counts
    them too; the last event has processed == total."""
    total: int
    cache: int
    processed: int
    time_ms: float


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
    salt: str | bytes | None = None       # the cache's: tenant and LoRA set (daemon/lora.py)
    use_cache: bool = True
    lora: tuple[float, ...] = ()          # each LoRA adapter's scale; () none
    timeout_s: float | None = None
    cancelled: bool = False
    chain: KeyChain | None = None         # the prompt's block keys, once hashed
    progress: bool = False                # emit Progress events during the prefill
    id_slot: int | None = None            # the slot (running sequence index) asked for
    images: tuple = ()                    # ImageSpan of each image in tokens, in order
    created: float = field(default_factory=time.perf_counter)
    stats: Stats = field(default_factory=Stats)


@dataclass(eq=False)
class Live:
    """A request that holds a sequence: from admission to its end. The scheduler makes
    it (req, seq, slot, t_prefill); the engine writes dec and t_decode."""
    req: Request
    seq: Sequence
    slot: int = 0                     # its index among the running (llama.cpp's id_slot)
    t_prefill: float = 0.0            # admitted (restore done)
    dec: Decoding | None = None       # made in its first step
    t_decode: float = 0.0             # the prompt's last token computed; 0 before

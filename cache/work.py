"""What passes between the scheduler and the cache manager for one step."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ckptd.cache.keys import KeyChain
from ckptd.cache.lookup import DEVICE
from ckptd.cache.why.report import CacheReport
from ckptd.model.sequence import Sequence


@dataclass
class RestoreInfo:
    """What admission restored for a new sequence."""
    cached_tokens: int = 0
    tier: str | None = None       # the slowest tier read: device, host, disk, remote or None
    device_tokens: int = 0        # of cached_tokens, those in adopted device pages
    restore_ms: float = 0.0
    logits: torch.Tensor | None = None   # last-position logits, when the snapshot had them
    fallbacks: int = 0            # plans abandoned because a piece failed verification
    by_tier: dict[str, int] | None = None   # restored tokens per tier, from the plan
    report: CacheReport | None = None       # where each restored block came from, and why
    #                                         not more (cache/why/)

    def tokens_by_tier(self) -> dict[str, int]:
        """Restored tokens by the tier that held them."""
        if self.by_tier is not None:
            return dict(self.by_tier)
        out = {DEVICE: self.device_tokens} if self.device_tokens else {}
        rest = self.cached_tokens - self.device_tokens
        if rest and self.tier is not None:
            out[self.tier] = out.get(self.tier, 0) + rest
        return out


@dataclass(eq=False)
class Tracked:
    """The cache manager's bookkeeping of one live sequence."""
    seq: Sequence
    chain: KeyChain | None        # block keys (None: the sequence does not use the cache)
    prompt_len: int
    prompt_done: bool = False
    stored_blocks: int = 0        # leading blocks the store holds (no need to put them)
    published: int = 0            # leading full pages registered on the device
    stops: dict[int, str] = field(default_factory=dict)   # position -> snapshot role
    shared: int = 0               # prompt tokens something cached or running shares


@dataclass(eq=False)
class Work:
    """One sequence's part of a step. The scheduler fills the first fields; `admit`
    the rest: how many tokens the sequence computes, what a new one restored, and
    whether it could not be given the memory it needs."""
    seq: Sequence
    budget: int                       # the most tokens the step may compute for it
    new: bool = False                 # its first step: admission restores it first
    chain: KeyChain | None = None     # a new sequence's block keys, if hashed already
    n: int = 0                        # tokens computed this step (0: none)
    restored: RestoreInfo | None = None
    deferred: bool = False            # a new sequence with no room now: it waits
    stalled: bool = False             # a running one with no pages this step: it waits
    error: Exception | None = None    # it can't go on

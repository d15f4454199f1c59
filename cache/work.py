"""What passes between the scheduler, the cache manager and the engine for one step.

The scheduler makes each sequence's Work whole: how many tokens it computes this step
(`n`: a decode's one token and its draft, or a prefill's share of the step's budget
ending at its next planned snapshot), and for a new sequence what its restore gave.
`cache.admit` then gives it the pages for them or refuses it (`refused`); after the
model step, `outcome()` is the one value the engine acts on. A decoding sequence's
draft (speculative decoding, daemon/speculation.py) rides on its Work the whole way:
its tokens count in `n`, and its outcome is its verification.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from ckptd.cache.keys import KeyChain
from ckptd.cache.lookup import DEVICE
from ckptd.cache.why.report import CacheReport
from ckptd.model.sampling.decoding import TokenEvent
from ckptd.model.sequence import Sequence
from ckptd.model.spec import StepLogits


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
    window_low: int = 0           # leading pages whose window-layer KV it reads no more
    #                               (a window model: cache/windows.py)


class Draft(Protocol):
    """A draft model's tokens appended to a decoding sequence for one step: the model
    computes them with the sequence's own token, every one's logits kept."""
    tokens: list[int]

    def verify(self, logits: torch.Tensor) -> list[TokenEvent]:
        """Sample over the step's rows [1 + drafted, vocab] while the draft is kept; the
        sequence goes back to its last kept token. The tokens gained, in order."""


@dataclass(frozen=True)
class Deferred:
    """A new sequence with no room this step (it holds nothing): back to the queue."""


@dataclass(frozen=True)
class Stalled:
    """A running sequence with no pages this step: it waits, computing nothing."""


@dataclass(frozen=True)
class Failed:
    """It can't go on: its restore failed, or it decodes and the pages ran out."""
    error: Exception


@dataclass(frozen=True)
class Computed:
    """It computed its tokens: its last token's logits [1, vocab]."""
    logits: torch.Tensor


@dataclass(frozen=True)
class Verified:
    """It computed its token and a draft's: what the sampler gained over their rows, in
    order. All but the last are in the sequence's tokens already (the kept draft)."""
    events: list[TokenEvent]


@dataclass(frozen=True)
class Repeated:
    """An exact repeat: nothing to compute, the restored snapshot's last logits [vocab]."""
    logits: torch.Tensor


@dataclass(frozen=True)
class Idle:
    """Nothing this step (its share of the budget was none)."""


Refusal = Deferred | Stalled | Failed
Outcome = Refusal | Computed | Verified | Repeated | Idle


@dataclass(eq=False)
class Work:
    """One sequence's part of a step. The scheduler writes every field but `refused`
    when it makes it (a new sequence whose restore failed comes refused: Failed);
    cache.admit writes `refused` when the work can't have its pages. Nothing else
    writes a Work."""
    seq: Sequence
    n: int                            # tokens it computes this step (drafted ones included)
    draft: Draft | None = None        # a draft model's tokens (of n), verified after the step
    new: bool = False                 # its first step: restored by the scheduler just now
    restored: RestoreInfo | None = None   # a new sequence's restore
    refused: Refusal | None = None    # why it computes nothing this step

    @property
    def drafted(self) -> int:
        """How many of its n tokens are a draft's."""
        return len(self.draft.tokens) if self.draft is not None else 0

    @property
    def runs(self) -> bool:
        """Whether the model computes tokens of it this step."""
        return self.refused is None and self.n > 0

    def outcome(self, logits: StepLogits) -> Outcome:
        """What became of it in the step: its refusal, its logits (a draft's verified:
        ask once), or nothing."""
        if self.refused is not None:
            return self.refused
        if self.draft is not None:
            return Verified(self.draft.verify(logits.of(self.seq)))
        if self.n:
            return Computed(logits.of(self.seq))
        if self.restored is not None and self.restored.logits is not None:
            return Repeated(self.restored.logits)
        return Idle()

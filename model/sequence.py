"""A sequence: one request's tokens and where their state lives.

The runner reads `tokens`, `num_computed`, `pages` (the KV page table) and `slot`
(the recurrent state slot) and advances `num_computed`. The cache manager
(cache/manager.py) attaches the slot, hands out the pages and keeps its own
bookkeeping of the sequence; nothing else writes these fields.
"""

from __future__ import annotations

import array
import itertools
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

_ids = itertools.count()


class FinishReason(str, Enum):
    STOP = "stop"              # EOS, a stop token or a stop string
    LENGTH = "length"          # max_tokens generated
    CANCELLED = "cancelled"    # the client left, or the server is shutting down
    ERROR = "error"            # failed: the error says why

    def __str__(self) -> str:
        return self.value


@dataclass(eq=False)             # a sequence is itself, not its contents: compare by identity
class Sequence:
    tokens: list[int]            # the prompt, then generated tokens as they are appended
    salt: str | bytes | None = None  # cache entries are namespaced by it (tenant, LoRA)
    use_cache: bool = True       # restore from the cache and leave checkpoints in it
    slot: int = -1               # recurrent state slot; -1 while detached
    pages: list[int] = field(default_factory=list)   # page i holds tokens [iB, (i+1)B)
    num_computed: int = 0        # leading tokens whose state (KV, recurrent) is computed
    id: int = field(default_factory=lambda: next(_ids))
    lora: tuple[float, ...] = ()  # each LoRA adapter's scale (model/lora); () none
    images: tuple = ()           # ImageSpan of each image's placeholder tokens, in order
    #                              (model/vision/positions.py); () for text



def check_token_ids(tokens: list[int], vocab_size: int) -> None:
    """ValueError naming the first id outside [0, vocab_size). In C loops: a 256K-token
    prompt takes ~1 ms (min() and max() over the list took ~3.5)."""
    if not tokens:
        return
    try:
        ids = np.frombuffer(array.array("q", tokens), dtype=np.int64)
        ok = int(ids.min()) >= 0 and int(ids.max()) < vocab_size
    except (OverflowError, TypeError):
        ok = False
    if not ok:
        bad = next(t for t in tokens if not (isinstance(t, int) and 0 <= t < vocab_size))
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")

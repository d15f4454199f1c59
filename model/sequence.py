"""A sequence: one request's tokens and where their state lives.

Who writes what (the runner reads them all to compute a step):

    tokens        made with the prompt (daemon/scheduler.py); the engine appends each
                  sampled token; speculation (daemon/speculation.py) appends a draft's
                  tokens and takes back those the model did not keep
    num_computed  the runner advances it (a step) or takes it back (rewind); the cache
                  sets it to what a restore brought (cache/restorer.py) or a fork shares
    pages         the cache (cache/manager.py, restorer.py): handed out, shared,
                  copied before a shared one is written
    cell          the runner (attach, detach), when the cache asks
    the rest      set when the sequence is made
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
    cell: int = -1               # recurrent state cell; -1 while detached
    pages: list[int] = field(default_factory=list)   # page i holds tokens [iB, (i+1)B)
    num_computed: int = 0        # leading tokens whose state (KV, recurrent) is computed
    id: int = field(default_factory=lambda: next(_ids))
    lora: tuple[float, ...] = ()  # each LoRA adapter's scale (model/lora); () none
    images: tuple = ()           # ImageSpan of each image's placeholder tokens, in order
    #                              (model/vision/positions.py); () for text



def check_token_ids(tokens: list[int], vocab_size: int) -> None:
    """ValueError naming the first id outside [0, vocab_size), in C loops (min() and
    max() over the list are slower: docs/BENCHMARKS.md, Measurements behind the code)."""
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

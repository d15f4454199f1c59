"""DRY ("don't repeat yourself"), as llama.cpp defines it (src/llama-sampler.cpp, from
koboldcpp): a token that would extend a sequence already seen in the last
`penalty_last_n` tokens (prompt and output) loses multiplier * base^(n - allowed_length)
of its logit, n the length of the longest such repeat, when n >= allowed_length.
Sequence breakers (strings) cut the repeats: none reaches back past the last breaker,
and a token that is one on its own is never penalised.

A breaker is matched on tokens as llama.cpp matches it: every token whose text holds
the string is a breaker on its own; a token whose text ends with the string's start is
the head of a breaker whose tail is the rest of the string, tokenized (at most
MAX_TAIL tokens).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

DEFAULT_BREAKERS = ("\n", ":", "\"", "*")
MAX_CHARS = 40             # llama.cpp's cut of one breaker string
MAX_TAIL = 20              # and of its tail, in tokens
_FLOAT_MAX_LOG = 88.7228391


@dataclass(frozen=True)
class DryParams:
    multiplier: float
    base: float
    allowed_length: int
    penalty_last_n: int                        # -1: the whole sequence
    breakers: tuple[tuple[int, tuple[int, ...]], ...]   # (head token, tail tokens)

    @property
    def active(self) -> bool:
        return self.multiplier != 0.0 and self.base >= 1.0 and self.penalty_last_n != 0


def breaker_tokens(strings: Sequence[str], texts: Sequence[str],
                   encode: Callable[[str], list[int]]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The (head, tail) token sequences of the breaker strings; `texts` is every token's
    text, by id."""
    out: set[tuple[int, tuple[int, ...]]] = set()
    for s in strings:
        s = s[:MAX_CHARS]
        if not s:
            continue
        for tid, word in enumerate(texts):
            if s in word:
                out.add((tid, ()))
                continue
            pos = word.find(s[0])
            while pos != -1:          # the word's end is the string's start
                rest = word[pos:]
                if s.startswith(rest):
                    out.add((tid, tuple(encode(s[len(rest):])[:MAX_TAIL])))
                pos = word.find(s[0], pos + 1)
    return tuple(sorted(out))


class BreakerTable:
    """breaker_tokens for one vocabulary, its token texts read once (at load) and each
    set of strings matched once (a few ms over a 50K vocabulary; cached)."""

    CACHE = 64

    def __init__(self, texts: Sequence[str], encode: Callable[[str], list[int]]) -> None:
        self.texts, self.encode = list(texts), encode
        self.lock = threading.Lock()
        self.cache: OrderedDict[tuple[str, ...], tuple] = OrderedDict()

    def __call__(self, strings: Sequence[str]) -> tuple[tuple[int, tuple[int, ...]], ...]:
        key = tuple(strings)
        with self.lock:
            hit = self.cache.get(key)
            if hit is not None:
                self.cache.move_to_end(key)
                return hit
        out = breaker_tokens(key, self.texts, self.encode)
        with self.lock:
            self.cache[key] = out
            while len(self.cache) > self.CACHE:
                self.cache.popitem(last=False)
        return out


class Dry:
    """One request's DRY: `adjust(logits)` then `seen(token)` per token."""

    def __init__(self, p: DryParams, prompt: Sequence[int] = ()) -> None:
        self.p = p
        self.history: list[int] = list(prompt)
        self.heads: dict[int, list[tuple[int, ...]]] = {}
        for head, tail in p.breakers:
            self.heads.setdefault(head, []).append(tail)

    def seen(self, token: int) -> None:
        self.history.append(token)

    def _rep_limit(self, last: list[int]) -> int:
        """How far back a repeat may reach: to the nearest breaker."""
        n = len(last)
        for i in range(n):
            tails = self.heads.get(last[n - 1 - i])
            if tails is None:
                continue
            longest = -1
            for tail in tails:
                k = len(tail)
                if longest < k <= i and all(tail[o] == last[n - 1 - (i - o - 1)]
                                            for o in range(k)):
                    longest = k
            if longest >= 0:
                return i - longest
        return n

    def penalties(self) -> dict[int, float]:
        """token -> what its logit loses now."""
        p = self.p
        n_last = len(self.history) if p.penalty_last_n < 0 else \
            min(len(self.history), p.penalty_last_n)
        if n_last <= p.allowed_length:
            return {}
        last = self.history[len(self.history) - n_last:]
        limit = self._rep_limit(last)
        if limit < p.allowed_length:
            return {}
        rev = last[::-1]                       # rev[i]: the token i from the end
        # z[k]: how many tokens before position k (from the end) repeat the sequence's end
        z = [0] * n_last
        lt = rt = 0
        for k in range(1, n_last):
            if k > rt:
                m = 0
                while m + k < n_last and rev[m] == rev[m + k]:
                    m += 1
                z[k] = m
                if m:
                    lt, rt = k, k + m - 1
            elif z[k - lt] < rt - k + 1:
                z[k] = z[k - lt]
            else:
                i = rt + 1
                while i < n_last and rev[i] == rev[i - k]:
                    i += 1
                z[k] = i - k
                lt, rt = k, i - 1
        longest: dict[int, int] = {}
        for k in range(1, n_last):
            length = min(z[k], limit)
            if length >= p.allowed_length:
                nxt = rev[k - 1]               # the token that followed that repeat
                if longest.get(nxt, -1) < length:
                    longest[nxt] = length
        cap = int(_FLOAT_MAX_LOG / math.log(p.base)) if p.base > 1.000001 else 0
        out = {}
        for tok, length in longest.items():
            if () in self.heads.get(tok, ()):  # a breaker on its own: never penalised
                continue
            exp = length - p.allowed_length
            out[tok] = p.multiplier * p.base ** (min(exp, cap) if cap > 0 else exp)
        return out

    def adjust(self, logits: torch.Tensor) -> torch.Tensor:
        pen = self.penalties()
        if not pen:
            return logits
        out = logits.float().clone()
        ids = torch.tensor([t for t in pen if t < out.numel()], dtype=torch.long)
        vals = torch.tensor([pen[t] for t in pen if t < out.numel()], dtype=out.dtype)
        out[ids] -= vals
        return out

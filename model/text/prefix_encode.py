"""Encode a long text that shares its start with a recent one by re-encoding only its end.

A memory-store question sends the same 4K-64K-token document before every question,
and a chat sends its whole history every turn; tokenizing that again costs more than
restoring its state from RAM (docs/BENCHMARKS.md, Measurements behind the code).

The splice: take the recent text with the longest common prefix, keep its tokens up
to a clean token boundary `MARGIN` characters before the texts part, back off
`OVERLAP` more tokens, encode the new text from there, and accept the result only if
that encoding reproduces the overlap tokens exactly (ids and character offsets).
Byte-level BPE with regex pre-splitting (every tokenizer ckptd builds) decides a
token from a few characters around it, so a re-encoding that has come back in step
with the old one over 32 tokens stays in step. Anything that does not (a tokenizer
that prepends a space to a text, a normalizer that looks far ahead) fails the check
and is encoded whole: a splice never returns other ids than a whole encoding.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from dataclasses import dataclass

MIN_CHARS = 2048     # shorter texts are encoded whole (a splice saves nothing)
MARGIN = 64          # characters before the texts part that the old tokens may not reach
OVERLAP = 32         # tokens re-encoded and compared
KEEP = 8             # recent texts kept
KEEP_CHARS = 1 << 25  # and at most this many characters of them (~32 MB of text)


@dataclass(frozen=True)
class _Encoded:
    text: str
    ids: list[int]
    starts: list[int]   # per token, the character span it came from
    ends: list[int]


class PrefixEncoder:
    """`encode(text)` equal to `tok.encode(text, add_special_tokens=False).ids`; `tok` is
    a `tokenizers.Tokenizer`. Thread-safe: the lock guards only the list of recent texts."""

    def __init__(self, tok) -> None:
        self.tok = tok
        self.recent: list[_Encoded] = []   # most recent last
        self.lock = threading.Lock()
        self.spliced = self.whole = 0      # counts, for tests and metrics

    def encode(self, text: str) -> list[int]:
        if len(text) < MIN_CHARS:
            return self.tok.encode(text, add_special_tokens=False).ids
        done = self._splice(text)
        if done is None:
            enc = self.tok.encode(text, add_special_tokens=False)
            starts, ends = (list(x) for x in zip(*enc.offsets)) if enc.ids else ([], [])
            done = _Encoded(text, enc.ids, starts, ends)
            self.whole += 1
        else:
            self.spliced += 1
        self._remember(done)
        return done.ids

    def _splice(self, text: str) -> _Encoded | None:
        with self.lock:
            recent = list(self.recent)
        best, shared = None, 0
        for old in recent:
            n = _common_prefix(old.text, text)
            if n > shared:
                best, shared = old, n
        if best is None or shared < MIN_CHARS:
            return None
        if shared == len(best.text) == len(text):
            return best
        j = _clean_boundary(best, bisect_right(best.ends, shared - MARGIN))
        j0 = _clean_boundary(best, j - OVERLAP)
        if j0 <= 0 or j - j0 < OVERLAP // 2:
            return None
        cut = best.ends[j0 - 1]   # not starts[j0]: offsets may leave out a leading space
        enc = self.tok.encode(text[cut:], add_special_tokens=False)
        k = j - j0
        if len(enc.ids) < k or enc.ids[:k] != best.ids[j0:j]:
            return None
        offsets = enc.offsets
        if any(s + cut != best.starts[j0 + i] or e + cut != best.ends[j0 + i]
               for i, (s, e) in enumerate(offsets[:k])):
            return None
        tail = offsets[k:]
        return _Encoded(text, best.ids[:j] + enc.ids[k:],
                        best.starts[:j] + [s + cut for s, _ in tail],
                        best.ends[:j] + [e + cut for _, e in tail])

    def _remember(self, done: _Encoded) -> None:
        with self.lock:
            self.recent = [e for e in self.recent if e.text != done.text] + [done]
            while len(self.recent) > KEEP or (
                    len(self.recent) > 1 and sum(len(e.text) for e in self.recent) > KEEP_CHARS):
                self.recent.pop(0)


def _common_prefix(a: str, b: str) -> int:
    """Length of the common prefix of a and b: a binary search of slice compares, each
    a memcmp in C (a character loop in Python would cost ms at these lengths)."""
    if b.startswith(a):
        return len(a)
    lo, hi = 0, min(len(a), len(b))     # a[:lo] == b[:lo]; a[:hi+1] != b[:hi+1] or hi at end
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _clean_boundary(e: _Encoded, j: int) -> int:
    """The last index <= j where token j starts after token j-1 ends: not inside one
    character that byte-level BPE spread over several tokens (they share its span)."""
    while 0 < j < len(e.ids) and e.starts[j] < e.ends[j - 1]:
        j -= 1
    return max(j, 0)

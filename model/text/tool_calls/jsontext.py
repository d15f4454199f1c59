"""Formats whose calls are bare JSON objects in the text (Llama 3.x, the generic one):
finding where such an object starts, with the text's whitespace ignored."""

from __future__ import annotations

import json
import re
from functools import lru_cache

from ckptd.model.text.tool_calls.base import ToolCall, json_call
from ckptd.model.text.tool_calls.jsonscan import skip_ws

_WS = re.compile(r"\s+")
_LOOK = 96          # the longest a start may run on with whitespace, while streaming


@lru_cache(maxsize=8)
def _pattern(starts: tuple[str, ...]) -> re.Pattern:
    # each start with any whitespace between its characters
    return re.compile("|".join(r"\s*".join(re.escape(c) for c in s) for s in starts))


def next_start(text: str, pos: int, starts: tuple[str, ...]) -> tuple[int, bool]:
    """(i, False): text[i] opens an object that begins like one of `starts` (written
    without whitespace, e.g. '{"name":'); (i, True): the text ends on what may still
    become one; (-1, False): neither. One regex scan: a stream re-reads its text on
    every piece, so a '{' that is not a start must not cost Python steps each time."""
    m = _pattern(starts).search(text, pos)
    if m is not None:
        return m.start(), False
    i = text.find("{", max(pos, len(text) - _LOOK))
    while i >= 0:
        head = _WS.sub("", text[i:])
        if any(s.startswith(head) for s in starts):
            return i, True
        i = text.find("{", i + 1)
    return -1, False


def parse_objects(text: str, partial: bool, starts: tuple[str, ...], read
                  ) -> tuple[str, list[ToolCall]]:
    """Content and calls of a text with call objects in it. `read(text, i)` reads the
    object at i: (content it holds, its calls, its end or None when unfinished), or
    ValueError when it is not a call after all."""
    content: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while True:
        i, maybe = next_start(text, pos, starts)
        if i < 0 or maybe:
            content.append(text[pos:] if i < 0 or not partial else text[pos:i])
            break
        try:
            said, found, end = read(text, i)
        except ValueError:
            content.append(text[pos:i + 1])
            pos = i + 1
            continue
        if end is None and not partial:
            content.append(text[pos:])          # cut off inside: its text stays content
            break
        content.append(text[pos:i] + said)
        calls += found
        if end is None:
            break
        k = skip_ws(text, end)
        pos = k + 1 if text.startswith(";", k) else end     # Llama 3.x's separator
    return "".join(content), calls


def one_call(text: str, i: int, names=()) -> tuple[str, list[ToolCall], int | None]:
    """A `read` for objects that are one call each."""
    call, end = json_call(text, i, names)
    return "", [] if call is None else [call], end


def partial_string(raw: str) -> str:
    """The text of a JSON string literal as far as it is written ('"ab\\' -> 'ab')."""
    for cut in range(0, 7):
        try:
            out = json.loads(raw[:len(raw) - cut] + '"')
            return out if isinstance(out, str) else ""
        except ValueError:
            continue
    return ""

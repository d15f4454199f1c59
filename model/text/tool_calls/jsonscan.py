"""A JSON scanner that reads as far as the text goes: where a value ends, or that it
has not ended yet. Tool-call parsers use it on a model's output while it streams, so
it must tell "incomplete so far" (None) from "not JSON" (ValueError)."""

from __future__ import annotations

import json

_WS = " \t\r\n"
_LITERALS = ("true", "false", "null")
_NUMBER = set("+-0123456789.eE")


def skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _string_end(s: str, i: int) -> int | None:
    """The index after the string starting at s[i] == '"', None when it is unfinished."""
    j = i + 1
    while True:
        q = s.find('"', j)
        if q < 0:
            return None
        k = q - 1
        while s[k] == "\\":
            k -= 1
        if (q - 1 - k) % 2 == 0:        # an even run of backslashes: the quote is real
            return q + 1
        j = q + 1


def value_end(s: str, i: int) -> int | None:
    """The index after the JSON value starting at s[i] (after whitespace), None when the
    text ends inside it; ValueError when it is not JSON."""
    i = skip_ws(s, i)
    if i >= len(s):
        return None
    c = s[i]
    if c == '"':
        return _string_end(s, i)
    if c in "{[":
        close = "}" if c == "{" else "]"
        j = skip_ws(s, i + 1)
        if j < len(s) and s[j] == close:
            return j + 1
        while True:
            if c == "{":
                j = skip_ws(s, j)
                if j >= len(s):
                    return None
                if s[j] != '"':
                    raise ValueError(f"expected a key at {j}")
                j = _string_end(s, j)
                if j is None:
                    return None
                j = skip_ws(s, j)
                if j >= len(s):
                    return None
                if s[j] != ":":
                    raise ValueError(f"expected ':' at {j}")
                j += 1
            j = value_end(s, j)
            if j is None:
                return None
            j = skip_ws(s, j)
            if j >= len(s):
                return None
            if s[j] == close:
                return j + 1
            if s[j] != ",":
                raise ValueError(f"expected ',' or {close!r} at {j}")
            j += 1
    for lit in _LITERALS:
        if s.startswith(lit, i):
            return i + len(lit)
        if lit.startswith(s[i:]):
            return None
    if c in _NUMBER:
        j = i
        while j < len(s) and s[j] in _NUMBER:
            j += 1
        return None if j == len(s) else j       # a number may go on in the next piece
    raise ValueError(f"unexpected {c!r} at {i}")


def object_fields(s: str, i: int) -> tuple[dict[str, tuple[int, int | None]], int | None]:
    """The members of the object starting at s[i] as far as they go: key -> (start of
    its value, its end or None), and the end of the object (None: unfinished). A key is
    listed once its value starts. ValueError when s[i] does not start an object."""
    i = skip_ws(s, i)
    if i >= len(s):
        return {}, None
    if s[i] != "{":
        raise ValueError(f"expected an object at {i}")
    out: dict[str, tuple[int, int | None]] = {}
    j = skip_ws(s, i + 1)
    if j < len(s) and s[j] == "}":
        return out, j + 1
    while True:
        j = skip_ws(s, j)
        if j >= len(s):
            return out, None
        if s[j] != '"':
            raise ValueError(f"expected a key at {j}")
        k = _string_end(s, j)
        if k is None:
            return out, None
        key = json.loads(s[j:k])
        k = skip_ws(s, k)
        if k >= len(s):
            return out, None
        if s[k] != ":":
            raise ValueError(f"expected ':' at {k}")
        start = skip_ws(s, k + 1)
        if start >= len(s):
            return out, None
        end = value_end(s, start)
        out[key] = (start, end)
        if end is None:
            return out, None
        j = skip_ws(s, end)
        if j >= len(s):
            return out, None
        if s[j] == "}":
            return out, j + 1
        if s[j] != ",":
            raise ValueError(f"expected ',' or '}}' at {j}")
        j += 1


def array_items(s: str, i: int) -> tuple[list[tuple[int, int | None]], int | None]:
    """The items of the array starting at s[i] as far as they go, as object_fields."""
    i = skip_ws(s, i)
    if i >= len(s) or s[i] != "[":
        raise ValueError(f"expected an array at {i}")
    out: list[tuple[int, int | None]] = []
    j = skip_ws(s, i + 1)
    if j < len(s) and s[j] == "]":
        return out, j + 1
    while True:
        start = skip_ws(s, j)
        if start >= len(s):
            return out, None
        end = value_end(s, start)
        out.append((start, end))
        if end is None:
            return out, None
        j = skip_ws(s, end)
        if j >= len(s):
            return out, None
        if s[j] == "]":
            return out, j + 1
        if s[j] != ",":
            raise ValueError(f"expected ',' or ']' at {j}")
        j += 1

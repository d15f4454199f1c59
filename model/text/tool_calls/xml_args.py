"""What the formats that write each argument in tags of its own share (Qwen3-Coder's
<parameter=k>, GLM's <arg_key>/<arg_value>): reading a tag that may be cut off, a
value typed by the function's schema, and the arguments as JSON text built one whole
argument at a time (a stream sends each once it is closed)."""

from __future__ import annotations

import ast
import json

from ckptd.model.text.tool_calls.jsonscan import skip_ws

_WS = (" ", "\t", "\r", "\n")


class Incomplete(Exception):
    """The text ends inside the call."""


def expect(s: str, i: int, lit: str) -> int:
    """The index after `lit` at s[i] (after whitespace); Incomplete when the text ends
    on a prefix of it, ValueError when something else is there."""
    i = skip_ws(s, i)
    if s.startswith(lit, i):
        return i + len(lit)
    if lit.startswith(s[i:]):
        raise Incomplete
    raise ValueError(f"expected {lit!r} at {i}")


def value(raw: str, typ: object, padded: bool = True) -> object:
    """A value written as text: a string when the schema types it so, else the JSON it
    reads as (text when it reads as none). `padded`: one whitespace character (a
    newline, as models write it) around the value is the format's, not the value's;
    more would cut a code value's indentation."""
    if padded:
        raw = raw[1:] if raw[:1] in _WS else raw
        raw = raw[:-1] if raw[-1:] in _WS else raw
    if typ == "string" or (isinstance(typ, list) and "string" in typ):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        pass
    # templates that write a value with jinja's `string` filter give Python's form
    # (`True`, `{'a': 1}`: Qwen3-Coder's booleans, Seed-OSS's and MiniCPM5's objects)
    try:
        got = ast.literal_eval(raw.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return raw
    return got if isinstance(got, (bool, int, float, dict, list)) or got is None else raw


def member(key: str, v: object) -> str:
    return f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"


def args(parts: list[str], done: bool) -> str:
    """The arguments as JSON text: the closed members, and the brace once done."""
    if not parts:
        return "{}" if done else ""
    return "{" + ", ".join(parts) + ("}" if done else "")


def keyed_args(schema: dict, begin, end: str, separator: str = "",
               quotes: tuple[str, str] = ("", "")) -> dict:
    """A structural tag's arguments for a format that writes each in tags of its own,
    where xgrammar has no style for it: begin(key) + the value + `end` per argument the
    schema names, each at most once, the required ones first and always, `separator`
    between them; a string as text between `quotes` up to their closing one, any other
    value as JSON held to its schema."""
    props = (schema or {}).get("properties") or {}
    required = set((schema or {}).get("required") or ())
    tags = {}
    for key, prop in props.items():
        prop = prop if isinstance(prop, dict) else {}
        if prop.get("type") == "string" and not ({"enum", "const", "pattern"} & set(prop)):
            tags[key] = (begin(key) + quotes[0], {"type": "any_text"}, quotes[1] + end)
        else:
            tags[key] = (begin(key), {"type": "json_schema", "json_schema": prop or True,
                                      "style": "json", "max_whitespace_cnt": 1}, end)

    def tag(key: str, first: bool) -> dict:
        b, content, e = tags[key]
        return {"type": "tag", "begin": b if first else separator + b, "content": content,
                "end": e}

    def optional(keys: list[str]) -> list[dict]:
        return [{"type": "optional", "content": tag(k, False)} for k in keys]

    must = [k for k in props if k in required]
    may = [k for k in props if k not in required]
    if must:
        return {"type": "sequence", "elements": [
            tag(must[0], True), *(tag(k, False) for k in must[1:]), *optional(may)]}
    # all optional: none, or a first one and any of those after it
    return {"type": "or", "elements": [{"type": "const_string", "value": ""}, *(
        {"type": "sequence", "elements": [tag(k, True), *optional(may[i + 1:])]}
        for i, k in enumerate(may))]}

"""Google's Gemma 4: each call in tags of its own, its arguments in Gemma's object
syntax: keys bare, strings between `<|"|>` marks, other values as JSON writes them,

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3,opts:{a:[1]}}<tool_call|>

(a value written as JSON, quoted keys and strings, reads too: ckptd's grammar writes
nested objects so). Text around the calls is content."""

from __future__ import annotations

import json

from ckptd.model.text.tool_calls.base import (
    ToolCall,
    ToolFormat,
    check_tool,
    scan_tagged,
    schema_type,
    single_call,
)
from ckptd.model.text.tool_calls.jsonscan import skip_ws, value_end
from ckptd.model.text.tool_calls.xml_args import Incomplete, expect, keyed_args, value

START, END, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_NAME_MAX = 200


def _scalar_end(s: str, i: int) -> int:
    for k in range(i, len(s)):
        if s[k] in ",}]" or s.startswith(QUOTE, k):
            return k
    raise Incomplete


def _value(s: str, i: int, typ: object = None) -> tuple[object, int]:
    """The value at s[i] and the index after it; Incomplete when the text ends in it."""
    i = skip_ws(s, i)
    if i >= len(s) or QUOTE.startswith(s[i:]):
        raise Incomplete
    if s.startswith(QUOTE, i):
        k = s.find(QUOTE, i + len(QUOTE))
        if k < 0:
            raise Incomplete
        return s[i + len(QUOTE):k], k + len(QUOTE)
    if s[i] == '"':
        end = value_end(s, i)
        if end is None:
            raise Incomplete
        return json.loads(s[i:end]), end
    if s[i] in "{[":
        close = "}" if s[i] == "{" else "]"
        out: dict | list = {} if close == "}" else []
        j = skip_ws(s, i + 1)
        while True:
            if j >= len(s):
                raise Incomplete
            if s[j] == close:
                return out, j + 1
            if isinstance(out, dict):
                key, j = _key(s, j)
                out[key], j = _value(s, j)
            else:
                item, j = _value(s, j)
                out.append(item)
            j = skip_ws(s, j)
            if j < len(s) and s[j] == ",":
                j = skip_ws(s, j + 1)
            elif j < len(s) and s[j] != close:
                raise ValueError(f"expected ',' or {close!r} at {j}")
    k = _scalar_end(s, i)
    return value(s[i:k].strip(), typ, False), k


def _key(s: str, j: int) -> tuple[str, int]:
    """An object's key (bare, or a JSON string) and the index after its colon."""
    if s[j] == '"':
        end = value_end(s, j)
        if end is None:
            raise Incomplete
        key = json.loads(s[j:end])
    else:
        end = s.find(":", j)
        if end < 0:
            raise Incomplete
        key = s[j:end].strip()
        if not key or any(c in key for c in ',{}[]"<\n'):
            raise ValueError(f"a bad key at {j}")
    return key, expect(s, end, ":")


def _call(s: str, i: int, schemas: dict[str, dict]) -> tuple[ToolCall | None, int | None]:
    """The call after the opening tag at s[i] and its end; (None, None) before its name
    is written, (the call so far, None) before it ends. ValueError: no call."""
    try:
        j = expect(s, i, "call:")
    except Incomplete:
        return None, None
    k = s.find("{", j)
    if k < 0:
        if len(s) - j > _NAME_MAX or "\n" in s[j:]:
            raise ValueError("a call's name runs on")
        return None, None
    name = s[j:k].strip()
    check_tool(name, schemas)
    try:
        arguments = {}
        j = skip_ws(s, k + 1)
        while True:
            if j >= len(s):
                raise Incomplete
            if s[j] == "}":
                break
            key, j = _key(s, j)
            arguments[key], j = _value(s, j, schema_type(schemas, name, key))
            j = skip_ws(s, j)
            if j < len(s) and s[j] == ",":
                j = skip_ws(s, j + 1)
            elif j < len(s) and s[j] != "}":
                raise ValueError(f"expected ',' or '}}' at {j}")
    except Incomplete:
        return ToolCall(name, "", False), None
    call = ToolCall(name, json.dumps(arguments, ensure_ascii=False))
    try:
        return call, expect(s, j + 1, END)
    except Incomplete:
        return call, len(s)                 # only the closing tag is missing


class Gemma4(ToolFormat):
    name = "gemma4"
    separator = ""

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        return scan_tagged(text, partial, START,
                           single_call(lambda t, j: _call(t, j, schemas)))

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f"{START}call:{name}{{",
                "content": keyed_args(schema, lambda k: f"{k}:", "", ",", (QUOTE, QUOTE)),
                "end": f"}}{END}"}

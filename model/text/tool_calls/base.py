"""What every tool-call format shares: a parsed call, the parse result, and the
pieces a format is built from.

A format reads a model's text in two modes: `partial` while it streams (an unfinished
call is reported as far as it goes, and text that may be the start of call markup is
held back), and final. What a partial parse reports only grows as text is added: the
content and each call's arguments of a later parse start with those of an earlier
one, so a stream can send the difference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ckptd.model.text.tool_calls.jsonscan import object_fields, skip_ws
from ckptd.model.text.tool_calls.xml_args import Incomplete


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str              # JSON text of an object; while streaming, as far as written
    done: bool = True
    id: str | None = None       # the model's own id for it, where its format writes one


class ToolFormat:
    """One family's call syntax. `tag(name, schema)` is the structural tag (xgrammar's
    `tag` format) a call of that function is; `separator` goes between parallel calls,
    `wrap` puts what a format writes around all of them. A format that `frames_content`
    writes plain answers in a frame of its own, so it reads every answer, tools or not."""

    name = ""
    separator = "\n"
    frames_content = False

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        """(content, calls) of `text` (no reasoning in it); `schemas`: each tool's
        parameters, for formats that write values without JSON types."""
        raise NotImplementedError

    def read(self, text: str, partial: bool, schemas: dict[str, dict],
             thinking: bool) -> tuple[str, list[ToolCall], str]:
        """parse, and the reasoning the format finds past the first thinking block
        (`thinking`: reasoning is read; a format whose later messages are reasoning,
        GPT-OSS's, gives it here)."""
        content, calls = self.parse(text, partial, schemas)
        return content, calls, ""

    def tag(self, name: str, schema: dict) -> dict:
        raise NotImplementedError

    def wrap(self, calls: dict) -> dict:
        return calls


def held(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker`: held
    back from a stream until the next piece tells."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def unframe(content: str, partial: bool, frames: tuple[str, ...]) -> str:
    """`content` without the marks a format frames its text in (Cohere's
    <|START_RESPONSE|>...); while streaming, a mark being written is held back."""
    for mark in frames:
        content = content.replace(mark, "")
    if partial:
        content = content[:len(content) - max(held(content, m) for m in frames)]
    return content


def scan_tagged(text: str, partial: bool, start: str, read) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a format whose calls follow the tag `start`, one call (see
    `single_call`) or a block of them after each tag. read(text, j) reads what follows a
    tag at j: (its calls, where the text goes on after them), or (the calls as far as
    they go, None) when the text ends inside them; ValueError when it is no call, and
    the tag stays text."""
    content: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while True:
        i = text.find(start, pos)
        if i < 0:
            tail = text[pos:]
            content.append(tail[:len(tail) - held(tail, start)] if partial else tail)
            break
        j = i + len(start)
        try:
            found, end = read(text, j)
        except ValueError:
            content.append(text[pos:j])
            pos = j
            continue
        if end is None:                     # the text ends inside the calls
            if partial:
                content.append(text[pos:i])
                calls += found
            else:
                content.append(text[pos:])  # cut off: its text stays content
            break
        content.append(text[pos:i])
        calls += found
        pos = end
    return "".join(content), calls


def single_call(read):
    """scan_tagged's reader for a tag that opens one call, from read(text, j) giving
    (the call, or None before its name is written; its end or None)."""
    def calls(text: str, j: int) -> tuple[list[ToolCall], int | None]:
        call, end = read(text, j)
        return ([] if call is None else [call]), end
    return calls


def block_calls(text: str, j: int, close: str, read_one) -> tuple[list[ToolCall], int | None]:
    """scan_tagged's reader for a block of calls that ends with `close`: read_one(text, k)
    reads the call at k, (call, its end), raising xml_args.Incomplete (carrying the call
    so far, or nothing) when the text ends inside it."""
    found: list[ToolCall] = []
    try:
        while True:
            k = skip_ws(text, j)
            if text.startswith(close, k):
                return found, k + len(close)
            if close.startswith(text[k:]):              # (also: nothing after it yet)
                # with its calls written, only the closing mark is missing
                return found, (len(text) if found else None)
            call, j = read_one(text, k)
            found.append(call)
    except Incomplete as e:                 # the text ends inside a call
        so_far = e.args[0] if e.args else None
        if so_far is not None and so_far.done:
            return found + [so_far], len(text)          # only closing marks are missing
        return found + ([so_far] if so_far is not None else []), None


def json_call(s: str, i: int, names=(),
              name_key: str = "name") -> tuple[ToolCall | None, int | None]:
    """A call written as a JSON object at s[i] — {"name" (or `name_key`): ..., "arguments"
    (or "parameters"): {...}} — as far as it goes, and the object's end (None: unfinished).
    The call is None until its name is complete. The arguments are the model's own
    JSON text (a JSON string holding JSON is read as that text); ValueError when s[i]
    is not an object with a string name, or (given `names`) one that names no tool:
    text that only looks like a call stays content."""
    fields, end = object_fields(s, i)
    span = fields.get(name_key)
    if span is None or span[1] is None:
        if end is not None:
            raise ValueError("a call object without a name")
        return None, None
    name = json.loads(s[span[0]:span[1]])
    if not isinstance(name, str) or not name:
        raise ValueError("a call's name must be a non-empty string")
    if names and name not in names:
        raise ValueError(f"{name!r} is not a tool")
    args = fields.get("arguments") or fields.get("parameters")
    if args is None:
        return ToolCall(name, "{}" if end is not None else "", end is not None), end
    a, b = args
    if b is None:                       # still being written
        return ToolCall(name, "" if s[a] == '"' else s[a:], False), None
    raw = s[a:b]
    if raw.startswith('"'):
        raw = json.loads(raw)
    return ToolCall(name, raw, end is not None), end


def schema_type(schemas: dict[str, dict], fn: str, param: str) -> object:
    """The JSON type the schema of `fn` gives `param` (None when it names none)."""
    props = (schemas.get(fn) or {}).get("properties")
    prop = props.get(param) if isinstance(props, dict) else None
    return prop.get("type") if isinstance(prop, dict) else None


def schema_content(schema: dict, style: str = "json") -> dict:
    """A structural tag's arguments held to `schema`; at most one whitespace character in
    a row, as models write JSON (an unbounded run lets a sampled call never end)."""
    return {"type": "json_schema", "json_schema": schema, "style": style,
            "max_whitespace_cnt": 1}


def check_tool(name: str, schemas: dict[str, dict]) -> None:
    """ValueError unless `name` names a call: not empty and, given tools, one of them."""
    if not name or (schemas and name not in schemas):
        raise ValueError(f"{name!r} is not a tool")

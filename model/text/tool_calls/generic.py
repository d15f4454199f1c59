"""The generic format, for templates that show no call syntax of their own (llama.cpp's
"generic" handler): the tools and this format are described to the model in the
system message, and it answers with JSON,

    {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}

or {"tool_calls": [...]} for several, {"response": "..."} for a plain answer (read
as content); other text is content as it stands."""

from __future__ import annotations

import json

from ckptd.model.text.tool_calls.base import ToolCall, ToolFormat, json_call, schema_content
from ckptd.model.text.tool_calls.jsonscan import array_items, object_fields
from ckptd.model.text.tool_calls.jsontext import parse_objects, partial_string

STARTS = ('{"tool_call":', '{"tool_calls":', '{"response":', '{"name":')


def _read(text: str, i: int, names) -> tuple[str, list[ToolCall], int | None]:
    fields, end = object_fields(text, i)
    if not fields:
        return "", [], end
    key, (a, b) = next(iter(fields.items()))
    if key == "name":
        call, end = json_call(text, i, names)
        return "", [] if call is None else [call], end
    if key == "response":
        if text[a] != '"':
            raise ValueError("response must be a string")
        return (json.loads(text[a:b]) if b is not None else partial_string(text[a:])), [], end
    items = [(a, b)] if key == "tool_call" else array_items(text, a)[0]
    calls = []
    for start, _ in items:
        call, _ = json_call(text, start, names)
        if call is not None:
            calls.append(call)
    return "", calls, end


class Generic(ToolFormat):
    name = "generic"

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        return parse_objects(text, partial, STARTS, lambda t, i: _read(t, i, schemas))

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag",
                "begin": f'{{"tool_call": {{"name": {json.dumps(name)}, "arguments": ',
                "content": schema_content(schema), "end": "}}"}


def instructions(tools: list[dict]) -> str:
    """What the system message tells a model whose template shows no tools."""
    listed = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return (f"Tools (JSON schemas of their arguments):\n{listed}\nTo call one, answer "
            'only {"tool_call": {"name": ..., "arguments": {...}}}.')


def written(calls: list[dict]) -> str:
    """Past calls ([{function: {name, arguments}}]) as the answer that made them: what a
    template that shows no tools renders for them (it renders no calls itself)."""
    objs = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in calls]
    out = {"tool_call": objs[0]} if len(objs) == 1 else {"tool_calls": objs}
    return json.dumps(out, ensure_ascii=False)

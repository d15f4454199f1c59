"""Fireworks' FireFunction v2 (a Llama 3 model): the calls as one JSON list after a
marker, text before it,

    functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]
"""

from __future__ import annotations

import json

from ckptd.model.text.tool_calls.base import ToolCall, ToolFormat, held, json_call, schema_content
from ckptd.model.text.tool_calls.jsonscan import array_items

MARK = "functools["


class FireFunctionV2(ToolFormat):
    name = "firefunction_v2"
    separator = ", "

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        i = text.find(MARK)
        if i < 0:
            return (text[:len(text) - held(text, MARK)] if partial else text), []
        try:
            items, end = array_items(text, i + len(MARK) - 1)
            calls = [c for c, _ in (json_call(text, a, schemas) for a, _ in items)
                     if c is not None]
        except ValueError:                  # not a list of calls: it stays text
            return text, []
        if end is None and not partial:
            return text, []                 # cut off: its text stays text
        return text[:i] + (text[end:] if end is not None else ""), calls

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f'{{"name": {json.dumps(name)}, "arguments": ',
                "content": schema_content(schema), "end": "}"}

    def wrap(self, calls: dict) -> dict:
        return {"type": "sequence", "elements": [
            {"type": "const_string", "value": MARK}, calls,
            {"type": "const_string", "value": "]"}]}

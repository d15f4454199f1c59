"""Llama 3.1 / 3.2 / 3.3 with custom tools: a call is a bare JSON object,

    {"name": "get_weather", "parameters": {"city": "Paris"}}

(some models write "type": "function" first or "arguments"); several are separated
by ';' or whitespace, and text around them is content."""

from __future__ import annotations

import json

from ckptd.model.text.tool_calls.base import ToolCall, ToolFormat, schema_content
from ckptd.model.text.tool_calls.jsontext import one_call, parse_objects

STARTS = ('{"name":', '{"type":"function","name":')


class Llama3(ToolFormat):
    name = "llama3"

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        return parse_objects(text, partial, STARTS,
                             lambda t, i: one_call(t, i, schemas))

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f'{{"name": {json.dumps(name)}, "parameters": ',
                "content": schema_content(schema), "end": "}"}

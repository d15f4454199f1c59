"""Hermes 2 Pro / Qwen2.5 / Qwen3: each call is a JSON object inside tags,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

with text around and between the calls kept as content."""

from __future__ import annotations

import json

from ckptd.model.text.tool_calls.base import (
    ToolCall,
    ToolFormat,
    json_call,
    scan_tagged,
    schema_content,
    single_call,
)
from ckptd.model.text.tool_calls.jsonscan import skip_ws

START, END = "<tool_call>", "</tool_call>"


class Hermes(ToolFormat):
    name = "hermes"

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int):
            call, end = json_call(text, j, schemas)
            if end is None:
                return call, None
            k = skip_ws(text, end)
            if text.startswith(END, k):
                return call, k + len(END)
            if END.startswith(text[k:]):
                return call, len(text)          # the text ends in (or before) the closing tag
            return call, k                      # a call without its closing tag
        return scan_tagged(text, partial, START, single_call(read))

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f'{START}\n{{"name": {json.dumps(name)}, "arguments": ',
                "content": schema_content(schema),
                "end": f"}}\n{END}"}

"""Hermes 2 Pro / Qwen2.5 / Qwen3: each call is a JSON object inside tags,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

with text around and between the calls kept as content."""

from __future__ import annotations

import json

from ckptd.model.text.tool_calls.base import ToolCall, ToolFormat, held, json_call, schema_content
from ckptd.model.text.tool_calls.jsonscan import skip_ws

START, END = "<tool_call>", "</tool_call>"


class Hermes(ToolFormat):
    name = "hermes"

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        content: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while True:
            i = text.find(START, pos)
            if i < 0:
                tail = text[pos:]
                content.append(tail[:len(tail) - held(tail, START)] if partial else tail)
                break
            j = i + len(START)
            try:
                call, end = json_call(text, j, schemas)
            except ValueError:                  # not a call: the markup stays text
                content.append(text[pos:j])
                pos = j
                continue
            if end is None:                     # the text ends inside the call
                if partial:
                    content.append(text[pos:i])
                    calls += [call] if call is not None else []
                else:
                    content.append(text[pos:])  # cut off: its text stays content
                break
            content.append(text[pos:i])
            calls.append(call)
            k = skip_ws(text, end)
            if text.startswith(END, k):
                pos = k + len(END)
            elif END.startswith(text[k:]):
                break                           # the text ends in (or before) the closing tag
            else:
                pos = k                         # a call without its closing tag
        return "".join(content), calls

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f'{START}\n{{"name": {json.dumps(name)}, "arguments": ',
                "content": schema_content(schema),
                "end": f"}}\n{END}"}

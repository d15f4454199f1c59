"""Formats that write all of an answer's calls as one JSON list between two marks, text
before it:

- Fireworks' FireFunction v2 (a Llama 3 model): `functools[{"name": ..., "arguments":
  {...}}, ...]`, no closing mark;
- ServiceNow's Apriel 1.5 / 1.6: `<tool_calls>[...]</tool_calls>` (the model may add an
  "id" to each call: it is not read);
- NVIDIA's Nemotron Nano v2: `<TOOLCALL>[...]</TOOLCALL>`.
"""

from __future__ import annotations

import json

from ckptd.model.text.tool_calls.base import ToolCall, ToolFormat, held, json_call, schema_content
from ckptd.model.text.tool_calls.jsonscan import array_items, skip_ws


class JsonList(ToolFormat):
    """`open` is the mark up to the list's `[`, `close` what follows its `]`."""
    open = ""
    close = ""
    separator = ", "

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        mark = self.open + "["
        i = text.find(mark)
        if i < 0:
            return (text[:len(text) - held(text, mark)] if partial else text), []
        try:
            items, end = array_items(text, i + len(mark) - 1)
            calls = [c for c, _ in (json_call(text, a, schemas) for a, _ in items)
                     if c is not None]
        except ValueError:                  # not a list of calls: it stays text
            return text, []
        if end is None:
            return (text[:i], calls) if partial else (text, [])  # cut off: it stays text
        if self.close:
            k = skip_ws(text, end)
            if text.startswith(self.close, k):
                end = k + len(self.close)
            elif self.close.startswith(text[k:]):
                end = len(text)             # the text ends in (or before) the closing mark
        return text[:i] + text[end:], calls

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f'{{"name": {json.dumps(name)}, "arguments": ',
                "content": schema_content(schema), "end": "}"}

    def wrap(self, calls: dict) -> dict:
        return {"type": "sequence", "elements": [
            {"type": "const_string", "value": self.open + "["}, calls,
            {"type": "const_string", "value": "]" + self.close}]}


class FireFunctionV2(JsonList):
    name = "firefunction_v2"
    open = "functools"


class Apriel(JsonList):
    name = "apriel"
    open, close = "<tool_calls>", "</tool_calls>"


class NemotronV2(JsonList):
    name = "nemotron_v2"
    open, close = "<TOOLCALL>", "</TOOLCALL>"

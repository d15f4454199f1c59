"""Sber's GigaChat 3 and 3.1: a call is one JSON object after a mark, text before it,

    <|function_call|>{"name": "get_weather", "arguments": {"city": "Paris"}}

(3.1); GigaChat 3 writes it as a message of its own, after the answer's text:
`<|message_sep|>\\n\\nfunction call<|role_sep|>\\n{...}`."""

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


class MarkedJson(ToolFormat):
    mark = ""

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int):
            return json_call(text, skip_ws(text, j), schemas)
        return scan_tagged(text, partial, self.mark, single_call(read))

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f'{self.mark}{{"name": {json.dumps(name)}, "arguments": ',
                "content": schema_content(schema), "end": "}"}


class GigaChat3(MarkedJson):
    name = "gigachat_v3"
    mark = "<|message_sep|>\n\nfunction call<|role_sep|>\n"


class GigaChat31(MarkedJson):
    name = "gigachat_v3_1"
    mark = "<|function_call|>"

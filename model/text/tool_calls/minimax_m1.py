"""MiniMax-M1: an answer's calls as JSON objects, one a line, in one block,

    <tool_calls>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    {"name": "ping", "arguments": {}}
    </tool_calls>

Text before the block is content."""

from __future__ import annotations

import json

from ckptd.model.text.tool_calls.base import (
    ToolCall,
    ToolFormat,
    block_calls,
    json_call,
    scan_tagged,
    schema_content,
)
from ckptd.model.text.tool_calls.xml_args import Incomplete

START, END = "<tool_calls>", "</tool_calls>"


class MiniMaxM1(ToolFormat):
    name = "minimax_m1"

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def one(text: str, k: int) -> tuple[ToolCall, int]:
            call, end = json_call(text, k, schemas)
            if end is None:
                raise Incomplete(call)
            return call, end

        def read(text: str, j: int) -> tuple[list[ToolCall], int | None]:
            return block_calls(text, j, END, one)
        return scan_tagged(text, partial, START, read)

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f'{{"name": {json.dumps(name)}, "arguments": ',
                "content": schema_content(schema), "end": "}"}

    def wrap(self, calls: dict) -> dict:
        return {"type": "sequence", "elements": [
            {"type": "const_string", "value": START + "\n"}, calls,
            {"type": "const_string", "value": "\n" + END}]}

"""Upstage's Solar Open: an answer's calls in one block, each with an id of its own
(ten letters or digits), the function's name, and the arguments as JSON,

    <|tool_calls|><|tool_call:begin|>a1b2c3d4e5<|tool_call:name|>get_weather
    <|tool_call:args|>{"city": "Paris"}<|tool_call:end|><|calls|>

(without the line breaks; `<|calls|>` ends the message, and may be its stop token).
The id is kept as the call's. Text before the block is content."""

from __future__ import annotations

from ckptd.model.text.tool_calls.base import (
    ToolCall,
    ToolFormat,
    block_calls,
    check_tool,
    scan_tagged,
    schema_content,
)
from ckptd.model.text.tool_calls.functionary import json_args
from ckptd.model.text.tool_calls.jsonscan import skip_ws
from ckptd.model.text.tool_calls.xml_args import Incomplete, expect

BLOCK, BLOCK_END = "<|tool_calls|>", "<|calls|>"
CALL, NAME, ARGS, CALL_END = ("<|tool_call:begin|>", "<|tool_call:name|>", "<|tool_call:args|>",
                              "<|tool_call:end|>")
_FIELD_MAX = 200


def _field(s: str, i: int, stop: str) -> tuple[str, int]:
    """The text from s[i] to `stop` and the index after it (Incomplete: not written)."""
    k = s.find(stop, i)
    if k < 0:
        if len(s) - i > _FIELD_MAX or "\n" in s[i:]:
            raise ValueError("a call's header runs on")
        raise Incomplete
    return s[i:k].strip(), k + len(stop)


def _call(s: str, i: int, schemas: dict[str, dict]) -> tuple[ToolCall, int]:
    call_id, j = _field(s, expect(s, i, CALL), NAME)
    name, j = _field(s, j, ARGS)
    check_tool(name, schemas)
    arguments, end = json_args(s, skip_ws(s, j))
    if end is None:
        raise Incomplete(ToolCall(name, arguments, False, call_id or None))
    try:
        return ToolCall(name, arguments, True, call_id or None), expect(s, end, CALL_END)
    except Incomplete:
        raise Incomplete(ToolCall(name, arguments, True, call_id or None)) from None


class SolarOpen(ToolFormat):
    name = "solar_open"
    separator = ""

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int) -> tuple[list[ToolCall], int | None]:
            return block_calls(text, j, BLOCK_END, lambda t, k: _call(t, k, schemas))
        return scan_tagged(text, partial, BLOCK, read)

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": CALL,
                "content": {"type": "sequence", "elements": [
                    {"type": "regex", "pattern": r"[a-z0-9]{10}"},
                    {"type": "const_string", "value": f"{NAME}{name}{ARGS}"},
                    schema_content(schema)]},
                "end": CALL_END}

    def wrap(self, calls: dict) -> dict:
        return {"type": "sequence", "elements": [
            {"type": "const_string", "value": BLOCK}, calls,
            {"type": "const_string", "value": BLOCK_END}]}

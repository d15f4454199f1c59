"""Moonshot's Kimi K2: an answer's calls in one section, each named by an id that is
`functions.` + the function's name + `:` + its index, the arguments as JSON,

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

(without the line breaks). The id names the function and is kept as the call's
id (as llama.cpp keeps it). Text before the section is content."""

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

SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARGS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_ID_MAX = 200


def _name(call_id: str) -> str:
    """The function an id names: `functions.NAME:INDEX` (also NAME:INDEX, NAME)."""
    name = call_id.strip().removeprefix("functions.")
    head, colon, index = name.rpartition(":")
    return head if colon and index.isdigit() else name


def _call(s: str, i: int, schemas: dict[str, dict]) -> tuple[ToolCall, int]:
    """The call at s[i] and the index after it; Incomplete carrying the call so far (or
    nothing) when the text ends inside it."""
    j = expect(s, i, CALL)
    k = s.find(ARGS, j)
    if k < 0:
        if len(s) - j > _ID_MAX or "\n" in s[j:]:
            raise ValueError("a call id runs on")
        raise Incomplete
    call_id = s[j:k].strip()
    name = _name(call_id)
    check_tool(name, schemas)
    arguments, end = json_args(s, skip_ws(s, k + len(ARGS)))
    if end is None:
        raise Incomplete(ToolCall(name, arguments, False, call_id))
    try:
        return ToolCall(name, arguments, True, call_id), expect(s, end, CALL_END)
    except Incomplete:
        raise Incomplete(ToolCall(name, arguments, True, call_id)) from None


class KimiK2(ToolFormat):
    name = "kimi_k2"
    separator = ""

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int) -> tuple[list[ToolCall], int | None]:
            return block_calls(text, j, SECTION_END, lambda t, k: _call(t, k, schemas))
        return scan_tagged(text, partial, SECTION, read)

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f"{CALL}functions.{name}:",
                "content": {"type": "sequence", "elements": [
                    {"type": "regex", "pattern": r"\d{1,3}"},   # (unbounded: may never end)
                    {"type": "const_string", "value": ARGS}, schema_content(schema)]},
                "end": CALL_END}

    def wrap(self, calls: dict) -> dict:
        return {"type": "sequence", "elements": [
            {"type": "const_string", "value": SECTION}, calls,
            {"type": "const_string", "value": SECTION_END}]}

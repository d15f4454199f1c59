"""DeepSeek V3.2 and V4: calls in DSML tags, a block of invokes, each parameter a tag
saying whether its value is a string (written as is) or JSON,

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

(V4 names the block `tool_calls`). Text before a block is content."""

from __future__ import annotations

import json

from ckptd.model.text.tool_calls.base import ToolCall, ToolFormat, scan_tagged, schema_content
from ckptd.model.text.tool_calls.jsonscan import skip_ws
from ckptd.model.text.tool_calls.xml_args import Incomplete, args, expect, member

D = "｜DSML｜"
INVOKE, INVOKE_END = f'<{D}invoke name="', f"</{D}invoke>"
PARAM, PARAM_END = f'<{D}parameter name="', f"</{D}parameter>"


def _value(raw: str, is_string: bool) -> object:
    if is_string:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _quoted_to(s: str, i: int, stop: str) -> tuple[str, int]:
    """The text from s[i] to `stop` and the index after it; Incomplete when it is not
    written yet, ValueError when a line ends first (no attribute runs on)."""
    k = s.find(stop, i)
    if k < 0:
        if "\n" in s[i:]:
            raise ValueError("an attribute runs on")
        raise Incomplete
    if "\n" in s[i:k]:
        raise ValueError("an attribute runs on")
    return s[i:k], k + len(stop)


def _invoke(s: str, i: int, schemas: dict[str, dict]) -> tuple[ToolCall, int]:
    """The invoke at s[i] and the index after it; Incomplete carrying the call so far
    (or nothing) when the text ends inside it."""
    j = expect(s, i, INVOKE)
    name, j = _quoted_to(s, j, '">')
    if not name or (schemas and name not in schemas):
        raise ValueError(f"{name!r} is not a tool")
    parts: list[str] = []
    try:
        while True:
            k = skip_ws(s, j)
            if s.startswith(INVOKE_END, k):
                return ToolCall(name, args(parts, True)), k + len(INVOKE_END)
            if k < len(s) and INVOKE_END.startswith(s[k:]):
                raise Incomplete            # the closing tag is being written
            j = expect(s, k, PARAM)
            param, j = _quoted_to(s, j, '"')
            j = expect(s, j, 'string="')
            kind, j = _quoted_to(s, j, '">')
            if kind not in ("true", "false"):
                raise ValueError(f"string={kind!r}")
            end = s.find(PARAM_END, j)
            if end < 0:
                raise Incomplete
            parts.append(member(param, _value(s[j:end], kind == "true")))
            j = end + len(PARAM_END)
    except Incomplete:
        raise Incomplete(ToolCall(name, args(parts, False), False)) from None


class Dsml(ToolFormat):
    block = ""
    separator = ""

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        close = f"</{D}{self.block}>"

        def read(text: str, j: int) -> tuple[list[ToolCall], int | None]:
            found: list[ToolCall] = []
            try:
                while True:
                    k = skip_ws(text, j)
                    if text.startswith(close, k):
                        return found, k + len(close)
                    if close.startswith(text[k:]):      # (also: nothing after it yet)
                        # with its invokes written, only the closing mark is missing
                        return found, (len(text) if found else None)
                    call, j = _invoke(text, k, schemas)
                    found.append(call)
            except Incomplete as e:         # the text ends inside an invoke
                so_far = e.args[0] if e.args else None
                return found + ([so_far] if so_far is not None else []), None
        return scan_tagged(text, partial, f"<{D}{self.block}>", read)

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f'{INVOKE}{name}">\n',
                "content": schema_content(schema, "deepseek_xml"), "end": f"{INVOKE_END}\n"}

    def wrap(self, calls: dict) -> dict:
        return {"type": "sequence", "elements": [
            {"type": "const_string", "value": f"<{D}{self.block}>\n"}, calls,
            {"type": "const_string", "value": f"</{D}{self.block}>"}]}


class DeepSeekV32(Dsml):
    name = "deepseek_v3_2"
    block = "function_calls"


class DeepSeekV4(Dsml):
    name = "deepseek_v4"
    block = "tool_calls"

"""Qwen3-Coder / Qwen3.5 (also Nemotron Nano 3): calls in XML, one parameter a tag,

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A value is text; it becomes a JSON string when the function's schema types the
parameter as a string, else the JSON it reads as (text when it reads as none). The
arguments are written as JSON one whole parameter at a time, so a stream sends each
parameter once it is closed. ByteDance's Seed-OSS writes the same calls in
`<seed:tool_call>` tags."""

from __future__ import annotations

from ckptd.model.text.tool_calls.base import (
    ToolCall,
    ToolFormat,
    check_tool,
    scan_tagged,
    schema_content,
    schema_type,
    single_call,
)
from ckptd.model.text.tool_calls.jsonscan import skip_ws
from ckptd.model.text.tool_calls.xml_args import Incomplete, args, expect, member, value

START, END = "<tool_call>", "</tool_call>"
FUNC, FUNC_END = "<function=", "</function>"
PARAM, PARAM_END = "<parameter=", "</parameter>"


class QwenXml(ToolFormat):
    name = "qwen_xml"
    start, end = START, END

    def _call(self, s: str, i: int, schemas: dict[str, dict]) -> tuple[ToolCall | None, int]:
        """The call after START at s[i] and the index after it. When the text ends
        inside it: Incomplete carrying (call so far or None,) as its argument."""
        j = expect(s, i, FUNC)
        close = s.find(">", j)
        if close < 0 or "\n" in s[j:close]:
            if close < 0 and "\n" not in s[j:]:
                raise Incomplete(None)
            raise ValueError("a function name runs on")
        name = s[j:close]
        check_tool(name, schemas)
        j, parts = close + 1, []
        while True:
            try:
                k = skip_ws(s, j)
                rest = s[k:]
                if rest.startswith(FUNC_END):
                    j = k + len(FUNC_END)
                    break
                if not rest.startswith(PARAM):
                    if FUNC_END.startswith(rest) or PARAM.startswith(rest):
                        raise Incomplete
                    raise ValueError(f"expected a parameter or {FUNC_END!r} at {k}")
                k += len(PARAM)
                gt = s.find(">", k)
                if gt < 0:
                    raise Incomplete
                param = s[k:gt]
                end = s.find(PARAM_END, gt + 1)
                if end < 0:
                    raise Incomplete
            except Incomplete:
                raise Incomplete(ToolCall(name, args(parts, False), False)) from None
            parts.append(member(param, value(s[gt + 1:end], schema_type(schemas, name, param))))
            j = end + len(PARAM_END)
        call = ToolCall(name, args(parts, True))
        try:
            j = expect(s, j, self.end)
        except Incomplete:
            raise Incomplete(call) from None
        return call, j

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int):
            try:
                return self._call(text, j, schemas)
            except Incomplete as e:
                so_far = e.args[0] if e.args else None
                if so_far is not None and so_far.done:
                    return so_far, len(text)    # only the closing tag is missing
                return so_far, None
        return scan_tagged(text, partial, self.start, single_call(read))

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f"{self.start}\n{FUNC}{name}>\n",
                "content": schema_content(schema, "qwen_xml"),
                "end": f"\n{FUNC_END}\n{self.end}"}


class SeedOss(QwenXml):
    name = "seed_oss"
    start, end = "<seed:tool_call>", "</seed:tool_call>"

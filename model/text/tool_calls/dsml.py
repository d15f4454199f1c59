"""DeepSeek V3.2 and V4: calls in DSML tags, a block of invokes, each parameter a tag
saying whether its value is a string (written as is) or JSON,

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

(V4 names the block `tool_calls`). MiniMax-M2 writes the same invokes without the
bars, in a `<minimax:tool_call>` block, and its parameters say no type: a value is
typed by the function's schema (as Qwen3-Coder's),

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>

OpenBMB's MiniCPM5 writes one such invoke per call, with no block around it, as
`function` and `param` tags; a value with markup in it is CDATA, and the template
writes values that are not strings as Python does (`True`, `{'a': 1}`):

    <function name="get_weather"><param name="city">Paris</param></function>

Text before a block is content."""

from __future__ import annotations

import json

from ckptd.model.text.tool_calls.base import (
    ToolCall,
    ToolFormat,
    block_calls,
    check_tool,
    scan_tagged,
    schema_content,
    schema_type,
    single_call,
)
from ckptd.model.text.tool_calls.jsonscan import skip_ws
from ckptd.model.text.tool_calls.xml_args import (
    Incomplete,
    args,
    expect,
    keyed_args,
    member,
    value,
)

D = "｜DSML｜"


def _value(raw: str, is_string: bool) -> object:
    if is_string:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def quoted_to(s: str, i: int, stop: str) -> tuple[str, int]:
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


CDATA, CDATA_END = "<![CDATA[", "]]>"


def _invoke(s: str, i: int, schemas: dict[str, dict], ns: str, marked: bool,
            tags: tuple[str, str] = ("invoke", "parameter")) -> tuple[ToolCall, int]:
    """The invoke at s[i] and the index after it, its tags (`tags`: the call's and a
    parameter's) prefixed by `ns`; `marked`: each parameter says string="true"/"false"
    (else the schema types it). Incomplete carrying the call so far (or nothing) when
    the text ends inside it."""
    invoke, parameter = tags
    invoke_end, param = f"</{ns}{invoke}>", f'<{ns}{parameter} name="'
    param_end = f"</{ns}{parameter}>"
    j = expect(s, i, f'<{ns}{invoke} name="')
    name, j = quoted_to(s, j, '">')
    check_tool(name, schemas)
    parts: list[str] = []
    try:
        while True:
            k = skip_ws(s, j)
            if s.startswith(invoke_end, k):
                return ToolCall(name, args(parts, True)), k + len(invoke_end)
            if k < len(s) and invoke_end.startswith(s[k:]):
                raise Incomplete            # the closing tag is being written
            j = expect(s, k, param)
            if marked:
                key, j = quoted_to(s, j, '"')
                j = expect(s, j, 'string="')
                kind, j = quoted_to(s, j, '">')
                if kind not in ("true", "false"):
                    raise ValueError(f"string={kind!r}")
            else:
                key, j = quoted_to(s, j, '">')
            typ = schema_type(schemas, name, key)
            if s.startswith(CDATA, j):      # (its text may hold the closing tag)
                end = s.find(CDATA_END, j)
                if end < 0:
                    raise Incomplete
                raw, j = s[j + len(CDATA):end], expect(s, end + len(CDATA_END), param_end)
                parts.append(member(key, value(raw, typ, False)))
                continue
            end = s.find(param_end, j)
            if end < 0:
                raise Incomplete
            raw = s[j:end]
            parts.append(member(key, _value(raw, kind == "true") if marked
                                else value(raw, typ, False)))
            j = end + len(param_end)
    except Incomplete:
        raise Incomplete(ToolCall(name, args(parts, False), False)) from None


class Invokes(ToolFormat):
    """A block (`start` ... `close`) of invokes whose tags are prefixed by `ns`."""
    start = close = ns = ""
    marked = True                   # parameters say string="true"/"false"
    style = "deepseek_xml"          # xgrammar's name for how the arguments are written
    separator = ""

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int) -> tuple[list[ToolCall], int | None]:
            return block_calls(text, j, self.close,
                               lambda t, k: _invoke(t, k, schemas, self.ns, self.marked))
        return scan_tagged(text, partial, self.start, read)

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f'<{self.ns}invoke name="{name}">\n',
                "content": schema_content(schema, self.style),
                "end": f"</{self.ns}invoke>\n"}

    def wrap(self, calls: dict) -> dict:
        return {"type": "sequence", "elements": [
            {"type": "const_string", "value": f"{self.start}\n"}, calls,
            {"type": "const_string", "value": self.close}]}


class DeepSeekV32(Invokes):
    name = "deepseek_v3_2"
    start, close, ns = f"<{D}function_calls>", f"</{D}function_calls>", D


class DeepSeekV4(Invokes):
    name = "deepseek_v4"
    start, close, ns = f"<{D}tool_calls>", f"</{D}tool_calls>", D


class MiniMaxM2(Invokes):
    name = "minimax_m2"
    start, close = "<minimax:tool_call>", "</minimax:tool_call>"
    marked = False
    style = "minimax_xml"


class MiniCpm5(ToolFormat):
    name = "minicpm5"
    start = '<function name="'

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int) -> tuple[ToolCall | None, int | None]:
            try:
                return _invoke(text, j - len(self.start), schemas, "", False,
                               ("function", "param"))
            except Incomplete as e:
                return (e.args[0] if e.args else None), None
        return scan_tagged(text, partial, self.start, single_call(read))

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f'{self.start}{name}">',
                "content": keyed_args(schema, lambda k: f'<param name="{k}">', "</param>"),
                "end": "</function>"}

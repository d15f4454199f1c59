"""GLM-4.5 / 4.6 / 4.7 (also Ling 3.0, Spark 2.5): the function's name after the tag,
then each argument as a key tag and a value tag,

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

(GLM-4.7 writes it without the newlines). A value is text, typed by the function's
schema as Qwen3-Coder's (xml_args.py); the templates write strings as they are and
other values as JSON."""

from __future__ import annotations

from ckptd.model.text.tool_calls.base import (
    ToolCall,
    ToolFormat,
    scan_tagged,
    schema_content,
    schema_type,
    single_call,
)
from ckptd.model.text.tool_calls.hermes import END, START
from ckptd.model.text.tool_calls.jsonscan import skip_ws
from ckptd.model.text.tool_calls.xml_args import Incomplete, args, expect, member, value

KEY, KEY_END = "<arg_key>", "</arg_key>"
VALUE, VALUE_END = "<arg_value>", "</arg_value>"


def _name(s: str, i: int, schemas: dict[str, dict]) -> tuple[str, int]:
    """The function's name after the opening tag, and where its arguments start."""
    ends = [k for k in (s.find("\n", i), s.find("<", i)) if k >= 0]
    if not ends:
        raise Incomplete(None)
    name = s[i:min(ends)].strip()
    if not name or (schemas and name not in schemas):
        raise ValueError(f"{name!r} is not a tool")
    return name, min(ends)


def _call(s: str, i: int, schemas: dict[str, dict]) -> tuple[ToolCall, int]:
    name, j = _name(s, i, schemas)
    parts: list[str] = []
    while True:
        try:
            k = skip_ws(s, j)
            rest = s[k:]
            if rest.startswith(END):
                return ToolCall(name, args(parts, True)), k + len(END)
            if not rest.startswith(KEY):
                if END.startswith(rest) or KEY.startswith(rest):
                    raise Incomplete
                raise ValueError(f"expected {KEY!r} or {END!r} at {k}")
            k += len(KEY)
            close = s.find(KEY_END, k)
            if close < 0:
                raise Incomplete
            key = s[k:close]
            k = expect(s, close + len(KEY_END), VALUE)
            end = s.find(VALUE_END, k)
            if end < 0:
                raise Incomplete
        except Incomplete:
            raise Incomplete(ToolCall(name, args(parts, False), False)) from None
        parts.append(member(key, value(s[k:end], schema_type(schemas, name, key), False)))
        j = end + len(VALUE_END)


class Glm(ToolFormat):
    name = "glm"

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int):
            try:
                return _call(text, j, schemas)
            except Incomplete as e:
                return (e.args[0] if e.args else None), None
        return scan_tagged(text, partial, START, single_call(read))

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f"{START}{name}\n",
                "content": schema_content(schema, "glm_xml"), "end": END}

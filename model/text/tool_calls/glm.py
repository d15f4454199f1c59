"""GLM-4.5 / 4.6 / 4.7 (also Ling 3.0, Spark 2.5): the function's name after the tag,
then each argument as a key tag and a value tag,

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

(GLM-4.7 writes it without the newlines). A value is text, typed by the function's
schema as Qwen3-Coder's (xml_args.py); the templates write strings as they are and
other values as JSON. Tencent's Hy3 writes the same with every tag suffixed
`:opensource`, a separator after the name, and the calls in one block:

    <tool_calls:opensource>
    <tool_call:opensource>get_weather<tool_sep:opensource>
    <arg_key:opensource>city</arg_key:opensource>
    <arg_value:opensource>Paris</arg_value:opensource>
    </tool_call:opensource>
    </tool_calls:opensource>"""

from __future__ import annotations

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
from ckptd.model.text.tool_calls.hermes import END, START
from ckptd.model.text.tool_calls.jsonscan import skip_ws
from ckptd.model.text.tool_calls.xml_args import (
    Incomplete,
    args,
    expect,
    keyed_args,
    member,
    value,
)


class Glm(ToolFormat):
    name = "glm"
    start, end, sep = START, END, ""
    key, key_end, value, value_end = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"

    def _name(self, s: str, i: int, schemas: dict[str, dict]) -> tuple[str, int]:
        """The function's name after the opening tag, and where its arguments start."""
        ends = [k for k in (s.find("\n", i), s.find("<", i)) if k >= 0]
        if not ends:
            raise Incomplete(None)
        name = s[i:min(ends)].strip()
        check_tool(name, schemas)
        if not self.sep:
            return name, min(ends)
        try:
            return name, expect(s, min(ends), self.sep)
        except Incomplete:
            raise Incomplete(None) from None

    def call(self, s: str, i: int, schemas: dict[str, dict]) -> tuple[ToolCall, int]:
        """The call whose name is at s[i]; Incomplete carrying it so far (or None)."""
        name, j = self._name(s, i, schemas)
        parts: list[str] = []
        while True:
            try:
                k = skip_ws(s, j)
                rest = s[k:]
                if rest.startswith(self.end):
                    return ToolCall(name, args(parts, True)), k + len(self.end)
                if not rest.startswith(self.key):
                    if self.end.startswith(rest) or self.key.startswith(rest):
                        raise Incomplete
                    raise ValueError(f"expected {self.key!r} or {self.end!r} at {k}")
                k += len(self.key)
                close = s.find(self.key_end, k)
                if close < 0:
                    raise Incomplete
                key = s[k:close]
                k = expect(s, close + len(self.key_end), self.value)
                end = s.find(self.value_end, k)
                if end < 0:
                    raise Incomplete
            except Incomplete:
                raise Incomplete(ToolCall(name, args(parts, False), False)) from None
            parts.append(member(key, value(s[k:end], schema_type(schemas, name, key), False)))
            j = end + len(self.value_end)

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int):
            try:
                return self.call(text, j, schemas)
            except Incomplete as e:
                return (e.args[0] if e.args else None), None
        return scan_tagged(text, partial, self.start, single_call(read))

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f"{START}{name}\n",
                "content": schema_content(schema, "glm_xml"), "end": END}


class Hy3(Glm):
    name = "hy3"
    start, end, sep = "<tool_call:opensource>", "</tool_call:opensource>", "<tool_sep:opensource>"
    key, key_end = "<arg_key:opensource>", "</arg_key:opensource>"
    value, value_end = "<arg_value:opensource>", "</arg_value:opensource>"
    block, block_end = "<tool_calls:opensource>", "</tool_calls:opensource>"

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def one(t: str, k: int) -> tuple[ToolCall, int]:
            return self.call(t, expect(t, k, self.start), schemas)

        def read(text: str, j: int) -> tuple[list[ToolCall], int | None]:
            return block_calls(text, j, self.block_end, one)
        return scan_tagged(text, partial, self.block, read)

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f"{self.start}{name}{self.sep}\n",
                "content": keyed_args(schema, lambda k: f"{self.key}{k}{self.key_end}\n"
                                      f"{self.value}", f"{self.value_end}\n"),
                "end": self.end}

    def wrap(self, calls: dict) -> dict:
        return {"type": "sequence", "elements": [
            {"type": "const_string", "value": f"{self.block}\n"}, calls,
            {"type": "const_string", "value": f"\n{self.block_end}"}]}

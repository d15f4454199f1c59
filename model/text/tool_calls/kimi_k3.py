"""Moonshot's Kimi K3: an answer is tagged sections, `<|open|>NAME<|sep|>` ...
`<|close|>NAME<|sep|>`: its thinking (`think`, opened by the prompt), its text
(`response`) and its calls (`tools`), each call its arguments one tag each, saying
the value's JSON type (a string is written as is, other values as JSON),

    <|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>
    <|open|>call tool="get_weather" index="1"<|sep|>
    <|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>
    <|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>

(without the line breaks). The response's marks and the message's end are not
content; the format reads every answer, tools or not, for them."""

from __future__ import annotations

from ckptd.model.text.tool_calls.base import (
    ToolCall,
    ToolFormat,
    block_calls,
    scan_tagged,
    schema_content,
    schema_type,
    unframe,
)
from ckptd.model.text.tool_calls.dsml import quoted_to
from ckptd.model.text.tool_calls.jsonscan import skip_ws
from ckptd.model.text.tool_calls.xml_args import Incomplete, args, expect, member, value

OPEN, CLOSE, SEP = "<|open|>", "<|close|>", "<|sep|>"
TOOLS, TOOLS_END = f"{OPEN}tools{SEP}", f"{CLOSE}tools{SEP}"
CALL_END, ARG_END = f"{CLOSE}call{SEP}", f"{CLOSE}argument{SEP}"
# marks that frame the text, not part of it
FRAMES = (f"{OPEN}response{SEP}", f"{CLOSE}response{SEP}", f"{CLOSE}message{SEP}",
          "<|end_of_msg|>")


def _call(s: str, i: int, schemas: dict[str, dict]) -> tuple[ToolCall, int]:
    j = expect(s, i, f'{OPEN}call tool="')
    name, j = quoted_to(s, j, '"')
    if name not in schemas:
        raise ValueError(f"{name!r} is not a tool")
    parts: list[str] = []
    try:
        j = s.find(SEP, j)              # (after the call's index)
        if j < 0:
            raise Incomplete
        j += len(SEP)
        while True:
            k = skip_ws(s, j)
            if s.startswith(CALL_END, k):
                return ToolCall(name, args(parts, True)), k + len(CALL_END)
            if k < len(s) and CALL_END.startswith(s[k:]):
                raise Incomplete
            j = expect(s, k, f'{OPEN}argument key="')
            key, j = quoted_to(s, j, '"')
            j = expect(s, j, 'type="')
            typ, j = quoted_to(s, j, '"')
            j = expect(s, j, SEP)
            end = s.find(ARG_END, j)
            if end < 0:
                raise Incomplete
            raw = s[j:end]
            # (xgrammar's kimi_k3_xml style puts a newline around a value: the
            # format's, as Qwen3-Coder's, not the value's)
            parts.append(member(key, value(raw, "string" if typ == "string" else
                                           schema_type(schemas, name, key))))
            j = end + len(ARG_END)
    except Incomplete:
        raise Incomplete(ToolCall(name, args(parts, False), False)) from None


class KimiK3(ToolFormat):
    name = "kimi_k3"
    separator = ""
    frames_content = True

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int) -> tuple[list[ToolCall], int | None]:
            return block_calls(text, j, TOOLS_END, lambda t, k: _call(t, k, schemas))
        content, calls = scan_tagged(text, partial, TOOLS, read)
        return unframe(content, partial, FRAMES), calls

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f'{OPEN}call tool="{name}" index="',
                "content": {"type": "sequence", "elements": [
                    {"type": "regex", "pattern": r"[1-9]\d{0,2}"},
                    {"type": "const_string", "value": f'"{SEP}'},
                    schema_content(schema, "kimi_k3_xml")]},
                "end": CALL_END}

    def wrap(self, calls: dict) -> dict:
        return {"type": "sequence", "elements": [
            {"type": "optional", "content": {"type": "const_string",
                                             "value": FRAMES[0] + FRAMES[1]}},
            {"type": "const_string", "value": TOOLS}, calls,
            {"type": "const_string", "value": TOOLS_END}]}

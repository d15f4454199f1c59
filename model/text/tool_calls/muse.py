"""Muse Glimmer (the ATEM protocol): an answer is messages, each addressed in its
header, `to=RECIPIENT<|message|>` (a message after the first opens with
`<|start|>assistant`), ending with `<|eom|>` (more follows) or `<|eot|>`: to `self`
is reasoning (the first is read as a thinking block, reasoning.py), to `user` the
answer, to a function its call, a block of invokes as MiniMax-M2's with every tag
prefixed `atem:`,

     to=get_weather<|message|><atem:function_calls>
    <atem:invoke name="get_weather">
    <atem:parameter name="city">Paris</atem:parameter>
    </atem:invoke>
    </atem:function_calls><|eom|>

Headers and ends are not content; a later message to `self` is reasoning too (with
reasoning not read, `reasoning_format: "none"`, messages to `self` stay in the content
as written). The format reads every answer, tools or not, for them."""

from __future__ import annotations

import re

from ckptd.model.text.tool_calls.base import (
    ToolCall,
    ToolFormat,
    block_calls,
    held,
    scan_tagged,
)
from ckptd.model.text.tool_calls.dsml import _invoke
from ckptd.model.text.tool_calls.xml_args import Incomplete, keyed_args

NS = "atem:"
BLOCK, BLOCK_END = f"<{NS}function_calls>", f"</{NS}function_calls>"
START, MESSAGE, ENDS = "<|start|>assistant", "<|message|>", ("<|eom|>", "<|eot|>")
_SELF = re.compile(
    r"(?:<\|start\|>assistant)?[ \t]*to=self[ \t]*<\|message\|>(.*?)(?:<\|eom\|>|$)", re.S)
_HEADER = re.compile(r"(?:<\|start\|>assistant)?[ \t]*to=[^\s<]*[ \t]*<\|message\|>|<\|eo[mt]\|>")
_UNFINISHED = re.compile(
    r"(?:<\|start\|>assistant)?[ \t]*(?:to=[^\s<]*[ \t]*(?:<[^>]*)?|to?)$"
    r"|<\|start\|>assistant[ \t]*$")


def _tool_invoke(s: str, k: int, schemas: dict[str, dict]) -> tuple[ToolCall, int]:
    """An invoke of one of the tools (the format reads answers without tools too)."""
    try:
        call, end = _invoke(s, k, schemas, NS, False)
    except Incomplete as e:
        so_far = e.args[0] if e.args else None
        if so_far is not None and so_far.name not in schemas:
            raise ValueError(f"{so_far.name!r} is not a tool") from None
        raise
    if call.name not in schemas:
        raise ValueError(f"{call.name!r} is not a tool")
    return call, end


class MuseGlimmer(ToolFormat):
    name = "muse_glimmer"
    separator = ""
    frames_content = True

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        content, calls, _ = self.read(text, partial, schemas, True)
        return content, calls

    def read(self, text: str, partial: bool, schemas: dict[str, dict],
             thinking: bool) -> tuple[str, list[ToolCall], str]:
        def calls_at(text: str, j: int) -> tuple[list[ToolCall], int | None]:
            return block_calls(text, j, BLOCK_END, lambda t, k: _tool_invoke(t, k, schemas))
        text, calls = scan_tagged(text, partial, BLOCK, calls_at)
        content: list[str] = []
        reasoning: list[str] = []
        pos = 0
        for m in _SELF.finditer(text):
            content.append(_HEADER.sub("", text[pos:m.start()]))
            if thinking:
                reasoning.append(m.group(1))
            else:
                content.append(m.group(0))      # as written
            pos = m.end()
        tail = _HEADER.sub("", text[pos:])
        if partial:                     # a header or an end being written is held back
            cut = _UNFINISHED.search(tail)
            tail = tail[:cut.start()] if cut else tail
        content.append(tail)
        out = "".join(content)
        if partial:
            out = out[:len(out) - max(held(out, m) for m in (START, *ENDS))]
            if reasoning:
                last = reasoning[-1]
                reasoning[-1] = last[:len(last) - held(last, ENDS[0])]
        return out, calls, "\n\n".join(reasoning)

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f'<{NS}invoke name="{name}">\n',
                "content": keyed_args(schema, lambda k: f'<{NS}parameter name="{k}">',
                                      f"</{NS}parameter>\n"),
                "end": f"</{NS}invoke>\n"}

    def wrap(self, calls: dict) -> dict:
        return {"type": "sequence", "elements": [
            {"type": "regex", "pattern": r"(<\|start\|>assistant)? to=[A-Za-z0-9_.\-]{1,64}"},
            {"type": "const_string", "value": f"{MESSAGE}{BLOCK}\n"}, calls,
            {"type": "const_string", "value": BLOCK_END}]}

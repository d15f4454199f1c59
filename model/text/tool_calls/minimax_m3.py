"""MiniMax M3: MiniMax-M2's invokes with every tag behind a namespace mark, and each
argument a tag named by its key; an object's members are tags of their own, a list's
items `item` tags,

    ]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="get_weather">]<]minimax[>[<city>Paris]<]minimax[>[</city>
    ]<]minimax[>[<opts>]<]minimax[>[<item>1]<]minimax[>[</item>]<]minimax[>[</opts>
    ]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

(without the line breaks inside an invoke). A value is text, typed by the function's
schema at the top (xml_args.py), read as JSON or kept as text below it."""

from __future__ import annotations

from ckptd.model.text.tool_calls.base import (
    ToolCall,
    ToolFormat,
    block_calls,
    check_tool,
    scan_tagged,
    schema_content,
    schema_type,
)
from ckptd.model.text.tool_calls.dsml import quoted_to
from ckptd.model.text.tool_calls.jsonscan import skip_ws
from ckptd.model.text.tool_calls.xml_args import Incomplete, args, expect, member, value

NS = "]<]minimax[>["
START, CLOSE = f"{NS}<tool_call>", f"{NS}</tool_call>"
_TAG_MAX = 200


def _tag(s: str, i: int) -> tuple[str, int]:
    """The tag (`<key>`, `</key>`) behind the mark at s[i], and the index after it."""
    j = expect(s, i, NS)
    if j < len(s) and s[j] != "<":
        raise ValueError(f"expected a tag at {j}")
    k = s.find(">", j)
    if k < 0:
        if len(s) - j > _TAG_MAX or "\n" in s[j:]:
            raise ValueError("a tag runs on")
        raise Incomplete
    return s[j:k + 1], k + 1


def _value(s: str, j: int, key: str, typ: object) -> tuple[object, int]:
    """The value after `<key>` at s[j] and the index after its closing tag."""
    k = s.find(NS, j)
    if k < 0:
        raise Incomplete
    text = s[j:k]
    tag, after = _tag(s, k)
    if tag == f"</{key}>":
        return value(text, typ, False), after
    if text.strip():
        raise ValueError(f"text before the members of {key!r}")
    members: list[tuple[str, object]] = []
    while tag != f"</{key}>":
        if tag.startswith("</"):
            raise ValueError(f"{tag!r} closes no open tag")
        child = tag[1:-1]
        v, k = _value(s, after, child, None)
        members.append((child, v))
        tag, after = _tag(s, k)
    if members and all(c == "item" for c, _ in members):
        return [v for _, v in members], after
    return dict(members), after


def _invoke(s: str, i: int, schemas: dict[str, dict]) -> tuple[ToolCall, int]:
    j = expect(s, i, f'{NS}<invoke name="')
    name, j = quoted_to(s, j, '">')
    check_tool(name, schemas)
    parts: list[str] = []
    try:
        while True:
            tag, j = _tag(s, skip_ws(s, j))
            if tag == "</invoke>":
                return ToolCall(name, args(parts, True)), j
            if tag.startswith("</") or " " in tag:
                raise ValueError(f"unexpected {tag!r}")
            key = tag[1:-1]
            v, j = _value(s, j, key, schema_type(schemas, name, key))
            parts.append(member(key, v))
    except Incomplete:
        raise Incomplete(ToolCall(name, args(parts, False), False)) from None


class MiniMaxM3(ToolFormat):
    name = "minimax_m3"
    separator = ""

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int) -> tuple[list[ToolCall], int | None]:
            return block_calls(text, j, CLOSE, lambda t, k: _invoke(t, k, schemas))
        return scan_tagged(text, partial, START, read)

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f'{NS}<invoke name="{name}">',
                "content": schema_content(schema, "minimax_m3_xml"),
                "end": f"{NS}</invoke>\n"}

    def wrap(self, calls: dict) -> dict:
        return {"type": "sequence", "elements": [
            {"type": "const_string", "value": f"{START}\n"}, calls,
            {"type": "const_string", "value": CLOSE}]}

"""Liquid's LFM2 / LFM2.5: an answer's calls as one list between two marks, written as
Python calls (as the models are trained, and LFM2.5's template writes past calls),

    <|tool_call_start|>[get_weather(city='Paris', days=3)]<|tool_call_end|>

or as a JSON list of {"name", "arguments"} objects (what llama.cpp's grammar makes
them write, and ckptd's, for tool_choice "required"). The list is read once its
closing mark is written: a stream reports the calls then."""

from __future__ import annotations

import ast
import json

from ckptd.model.text.tool_calls.base import ToolCall, json_call, scan_tagged
from ckptd.model.text.tool_calls.json_list import JsonList
from ckptd.model.text.tool_calls.jsonscan import array_items

START, END = "<|tool_call_start|>", "<|tool_call_end|>"


def _python_calls(body: str, schemas: dict[str, dict]) -> list[ToolCall]:
    """[f(k=v, ...), ...] read as Python literals; ValueError when it is anything else."""
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"not a list of calls: {e}") from None
    items = tree.elts if isinstance(tree, ast.List) else [tree]
    calls = []
    for node in items:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            raise ValueError("a call is name(key=value, ...)")
        name = node.func.id
        if schemas and name not in schemas:
            raise ValueError(f"{name!r} is not a tool")
        arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
        calls.append(ToolCall(name, json.dumps(arguments, ensure_ascii=False)))
    return calls


class Lfm2(JsonList):
    name = "lfm2"
    open, close = START, END

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int) -> tuple[list[ToolCall], int | None]:
            k = text.find(END, j)
            if k < 0:
                return [], None
            body = text[j:k].strip()
            if body.startswith("[") and body[1:].lstrip().startswith("{"):
                items, end = array_items(body, 0)
                if end is None:
                    raise ValueError("an unfinished list")
                calls = [json_call(body, a, schemas)[0] for a, _ in items]
                return [c for c in calls if c is not None], k + len(END)
            return _python_calls(body, schemas), k + len(END)
        return scan_tagged(text, partial, START, read)

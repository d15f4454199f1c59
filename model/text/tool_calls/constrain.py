"""The grammar behind tool_choice, as an xgrammar structural tag (JSON text for
model/sampling/grammar.py): each function's call in the format's syntax, its arguments
held to the function's JSON schema.

- "required": the answer is one call or more (one without parallel calls), nothing else;
- a named function: one call of it;
- "auto", "none": no grammar. (A lazy grammar from a call's first characters on, as
  llama.cpp's, cost a 49K-vocabulary mask on every token of plain text with xgrammar's
  triggered tags, a decode step's time again on the CPU: auto answers are read, not
  constrained, as vLLM's.)

A template whose answer starts inside a thinking block may finish thinking first, or,
with thinking turned off, closes it at once (MiniMax-M2's prompt opens one always)."""

from __future__ import annotations

import json

from ckptd.model.text.tool_calls.base import ToolFormat
from ckptd.model.text.tool_calls.reasoning import THINK, Marks


def structural_tag(fmt: ToolFormat, tools: list[dict], choice: str, named: str | None,
                   parallel: bool, open_thinking: bool, thinking: bool,
                   schema=lambda s: s, marks: Marks = THINK) -> str | None:
    """The structural tag for this choice, or None ("none"). `schema` adapts a tool's
    parameter schema to what the compiler reads; `marks` are the thinking block's."""
    if (choice in ("none", "auto") and named is None) or not tools:
        return None
    fns = [t["function"] for t in tools]
    if named is not None:
        fns = [f for f in fns if f["name"] == named]
    tags = [fmt.tag(f["name"], schema(f.get("parameters") or {"type": "object"}))
            for f in fns]
    body = fmt.wrap({"type": "tags_with_separator", "tags": tags, "separator": fmt.separator,
                     "at_least_one": True, "stop_after_first": named is not None or not parallel})
    think = {"type": "tag", "begin": "" if open_thinking else marks.open,
             "content": {"type": "any_text"}, "end": marks.close}
    ws = {"type": "regex", "pattern": r"\s*"}
    if open_thinking:       # (thinking turned off: the block the prompt opened is closed)
        first = think if thinking else {"type": "const_string", "value": marks.close}
        body = {"type": "sequence", "elements": [first, ws, body]}
    elif thinking:
        body = {"type": "sequence", "elements": [
            {"type": "optional", "content": {"type": "sequence", "elements": [think, ws]}},
            body]}
    return json.dumps({"type": "structural_tag", "format": body}, sort_keys=True)

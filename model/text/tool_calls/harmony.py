"""OpenAI's GPT-OSS (the harmony format): an answer is messages on channels, each
`<|channel|>NAME`, a header, `<|message|>`, the text, and `<|end|>` (`<|call|>` after
a call, `<|return|>` at the answer's end); a message after the first opens with
`<|start|>assistant`. `analysis` is reasoning (the first one is read as a thinking
block, reasoning.py, a later one here; with thinking not read, reasoning_format
"none", it stays in the content as written, as llama-server leaves it), `final` and
a `commentary` message to no one are content, and a message to a function is a call
of it, its text the JSON arguments:

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": 1}<|call|>

(the recipient may also stand before the channel: `to=functions.NAME<|channel|>...`,
as the template writes past calls). Text outside any message is content."""

from __future__ import annotations

import re

from ckptd.model.text.tool_calls.base import ToolCall, ToolFormat, held, schema_content
from ckptd.model.text.tool_calls.functionary import json_args
from ckptd.model.text.tool_calls.jsonscan import skip_ws

START, CHANNEL, MESSAGE = "<|start|>assistant", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_HEADER_MAX = 200
_RECIPIENT = re.compile(r"\bto=functions\.([^\s<]+)")


def _body_end(text: str, i: int) -> tuple[int, int]:
    """Where a message's text from i ends, and where what follows it starts (the
    text's end, and -1, when it has not ended)."""
    best = (len(text), -1)
    for mark in (*ENDS, START, CHANNEL):
        k = text.find(mark, i)
        if k >= 0 and k < best[0]:
            best = (k, k + len(mark) if mark in ENDS else k)
    return best


class Harmony(ToolFormat):
    name = "gpt_oss"
    separator = START
    frames_content = True

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        content, calls, _ = self.read(text, partial, schemas, True)
        return content, calls

    def read(self, text: str, partial: bool, schemas: dict[str, dict],
             thinking: bool) -> tuple[str, list[ToolCall], str]:
        content: list[str] = []
        calls: list[ToolCall] = []
        reasoning: list[str] = []
        pos = 0
        while pos < len(text):
            k = skip_ws(text, pos)
            started = text.startswith(START, k)
            k += len(START) if started else 0
            head = text.find(MESSAGE, k)
            header = text[k:head if head >= 0 else len(text)]
            if not header.lstrip().startswith((CHANNEL, "to=")) or len(header) > _HEADER_MAX:
                rest = text[pos:]
                if not partial:
                    content.append(rest)    # no message: it is text
                elif not started and not any(m.startswith(text[k:]) for m in (START, CHANNEL)):
                    content.append(rest[:len(rest) - max(held(rest, START), held(rest, CHANNEL))])
                break
            if head < 0:                    # a header still being written
                if not partial:
                    content.append(text[pos:])
                break
            words = header.split(CHANNEL, 1)[-1].split()
            channel = words[0] if words else ""
            to = _RECIPIENT.search(header)
            body = head + len(MESSAGE)
            if to is not None:
                name = to.group(1)
                if name not in schemas:     # (it reads answers without tools too)
                    content.append(text[pos:])
                    break
                arguments, end = json_args(text, skip_ws(text, body))
                if end is None:
                    if partial:
                        calls.append(ToolCall(name, arguments, False))
                    else:
                        content.append(text[pos:])  # cut off: its text stays text
                    break
                calls.append(ToolCall(name, arguments))
                _, pos = _body_end(text, end)
                if pos < 0:
                    break
                continue
            stop, nxt = _body_end(text, body)
            if channel == "analysis" and not thinking:      # the message as written
                piece = text[pos:nxt if nxt >= 0 else len(text)]
            else:
                piece = text[body:stop]
            if nxt < 0 and partial:
                piece = piece[:len(piece) - max(held(piece, m) for m in (*ENDS, START))]
            (reasoning if channel == "analysis" and thinking else content).append(piece)
            if nxt < 0:
                break
            pos = nxt
        return "".join(content), calls, "\n\n".join(reasoning)

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag",
                "begin": f"{CHANNEL}commentary to=functions.{name} <|constrain|>json{MESSAGE}",
                "content": schema_content(schema), "end": "<|call|>"}

    def wrap(self, calls: dict) -> dict:
        # after a thinking block, the call is a message of its own
        return {"type": "sequence", "elements": [
            {"type": "optional", "content": {"type": "const_string", "value": START}}, calls]}

"""Thinking blocks: `<think>...</think>` at the start of an answer is reasoning, sent as
`reasoning_content` (llama-server's default reasoning format). A template that opens
the block in the prompt (Qwen3.5, DeepSeek-R1: the prompt ends with `<think>`) starts
the answer inside it."""

from __future__ import annotations

from ckptd.model.text.tool_calls.base import held
from ckptd.model.text.tool_calls.jsonscan import skip_ws

OPEN, CLOSE = "<think>", "</think>"


def uses_thinking(template: str | None) -> bool:
    return bool(template) and CLOSE in template


def opens_thinking(prompt_end: str) -> bool:
    """Whether a prompt ending with this text leaves a thinking block open."""
    s = prompt_end.rstrip()
    return s.endswith(OPEN)


def split(text: str, partial: bool, open_at_start: bool) -> tuple[str, str]:
    """(reasoning, the rest). While streaming, text that may still be the opening or
    closing tag is held back (in neither)."""
    start = 0
    if not open_at_start:
        i = skip_ws(text, 0)
        if text.startswith(OPEN, i):
            start = i + len(OPEN)
        elif partial and OPEN.startswith(text[i:]):
            return "", ""                      # may be the opening tag: undecided
        else:
            return "", text
    end = text.find(CLOSE, start)
    if end < 0:
        body = text[start:]
        if partial:
            body = body[:len(body) - held(body, CLOSE)]
        return body.strip(), ""
    return text[start:end].strip(), text[end + len(CLOSE):]

"""Thinking blocks: a block of reasoning at the start of an answer is sent as
`reasoning_content` (llama-server's default reasoning format), in the marks its chat
template writes: `<think>...</think>` (Qwen3, DeepSeek-R1...), Cohere's
`<|START_THINKING|>...<|END_THINKING|>`, Mistral's `[THINK]...[/THINK]`, GPT-OSS's
analysis message, and Apriel 1.6's, which has no opening mark: its answer is reasoning
up to `[BEGIN FINAL RESPONSE]` (as llama.cpp's chat parsers read them). A template
that opens the block in the prompt (Qwen3.5, DeepSeek-R1 and Cohere2 end it with the
opening mark) starts the answer inside it."""

from __future__ import annotations

from dataclasses import dataclass

from ckptd.model.text.tool_calls.base import held
from ckptd.model.text.tool_calls.jsonscan import skip_ws


@dataclass(frozen=True)
class Marks:
    """A thinking block's opening and closing marks; no opening mark: every answer
    starts inside the block."""
    open: str
    close: str


THINK = Marks("<think>", "</think>")
# Each is known by its closing mark in the template's source
_MARKS = (THINK, Marks("<|START_THINKING|>", "<|END_THINKING|>"), Marks("[THINK]", "[/THINK]"),
          Marks("<mm:think>", "</mm:think>"),                          # MiniMax M3
          Marks("<|channel>thought", "<channel|>"))                     # Gemma 4
# Muse Glimmer's message to itself (muse.py), known by its opening
MUSE = Marks("to=self<|message|>", "<|eom|>")
# Kimi K3's sections, which its template writes with a macro: open_tag('think')
KIMI_K3 = Marks("<|open|>think<|sep|>", "<|close|>think<|sep|>")
# GPT-OSS's analysis message (harmony.py), known by its opening (others end turns with <|end|>)
HARMONY = Marks("<|channel|>analysis<|message|>", "<|end|>")
# Apriel 1.6 writes a past answer's reasoning_content before this mark (Apriel 1.5 only
# asks for it in a system prompt, and llama.cpp reads no reasoning there either)
APRIEL = Marks("", "[BEGIN FINAL RESPONSE]")


def marks_of(template: str | None) -> Marks | None:
    """The thinking marks a chat template writes; None: it has no thinking blocks."""
    if not template:
        return None
    if HARMONY.open in template:
        return HARMONY
    if MUSE.open in template:
        return MUSE
    if "<|open|>" in template and "open_tag('think')" in template:
        return KIMI_K3
    for m in _MARKS:
        if m.close in template:
            return m
    if APRIEL.close in template and "reasoning_content" in template:
        return APRIEL
    return None


def opens_thinking(prompt_end: str, marks: Marks = THINK) -> bool:
    """Whether a prompt ending with this text leaves a thinking block open."""
    return not marks.open or prompt_end.rstrip().endswith(marks.open)


def split(text: str, partial: bool, open_at_start: bool,
          marks: Marks = THINK) -> tuple[str, str]:
    """(reasoning, the rest). While streaming, text that may still be the opening or
    closing mark is held back (in neither)."""
    start = 0
    if not open_at_start and marks.open:
        i = skip_ws(text, 0)
        if text.startswith(marks.open, i):
            start = i + len(marks.open)
        elif partial and marks.open.startswith(text[i:]):
            return "", ""                      # may be the opening mark: undecided
        else:
            return "", text
    end = text.find(marks.close, start)
    if end < 0:
        body = text[start:]
        if partial:
            body = body[:len(body) - held(body, marks.close)]
        return body.strip(), ""
    return text[start:end].strip(), text[end + len(marks.close):]

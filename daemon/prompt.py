"""A prompt as the engine takes it, with where its structure says the next one parts.

A memory-store client sends a long document (or system message) and asks; the next
request sends the same start and another question. A hybrid model's state can be
restored only where a snapshot was taken, so the first request's prefill stops where
the next one is likely to part and leaves a snapshot there (cache/checkpoints.py),
which makes the second question compute only itself:

    chat           the start of the last user message (after the turns before it: a
                   new question after the same system message and history) and the
                   end of the messages before the generation prompt (the next turn of
                   the conversation, whose history renders the answer the template's
                   way, which need not be the tokens that were generated)
    named context  its end, always: every request naming it parts there
    raw prompt     tail snapshots a few offsets before its end, planned by the cache

The anchors are token positions of character offsets of the rendered text: where a
token straddles the offset, the tokens before it (their state is what the next
prompt shares).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

from ckptd.daemon.http.chat import ChatPrompt


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    salt: str | None = None
    anchors: tuple[int, ...] = ()    # token positions where the next prompt will part
    tails: bool = True               # a raw prompt: tail snapshots near its end


def anchors_at(ends: list[int], chars: Iterable[int], n: int) -> tuple[int, ...]:
    """The token positions of character offsets in a text of n tokens (ends: where each
    token ends): how many tokens end at or before each offset, where that lies inside."""
    return tuple(sorted({p for p in (bisect_right(ends, c) for c in chars) if 0 < p < n}))


def chat_heads(chat: ChatPrompt) -> list[ChatPrompt]:
    """The renderings whose ends are a chat prompt's anchors: the messages before its last
    user message, and all of them without the generation prompt (or the answer's start
    that is continued)."""
    msgs = chat.messages
    last_user = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=0)
    heads = [chat.with_messages(msgs[:last_user], False)] if last_user else []
    if chat.add_generation_prompt or chat.prefill is not None:
        heads.append(chat.with_messages(msgs, False))
    return heads

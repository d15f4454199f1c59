"""A chat answer read as it is generated: reasoning, content and tool calls, and what
each new piece of text adds to them (the deltas a stream sends).

Every feed re-reads the answer so far in partial mode and sends the difference from
what was sent; a parse only grows (base.py), so the pieces a stream sends add up to
the answer read whole at the end.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from ckptd.model.text.tool_calls import reasoning
from ckptd.model.text.tool_calls.base import ToolCall, ToolFormat


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def call_ids(calls, ids: list[str] | None = None) -> list[str]:
    """Each call's id: the model's own where its format writes one (Kimi K2's
    functions.NAME:0, Mistral's 9-character ids...) and it is new in the answer, else
    one of ckptd's. `ids`: those given already (a stream's), extended in place."""
    ids = [] if ids is None else ids
    for c in calls[len(ids):]:
        ids.append(c.id if c.id and c.id not in ids else call_id())
    return ids


@dataclass(frozen=True)
class Parsed:
    content: str
    calls: tuple[ToolCall, ...] = ()
    reasoning: str = ""


@dataclass(frozen=True)
class CallDelta:
    index: int
    id: str | None              # with the name, in a call's first delta only
    name: str | None
    arguments: str


@dataclass
class Delta:
    content: str = ""
    reasoning: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.calls)


@dataclass(frozen=True)
class ReplySpec:
    """How to read one answer: the call format (None: calls are not parsed), each tool's
    parameter schema, whether thinking blocks are read (in `marks`) and whether the
    answer starts inside one, and whether more than one call is kept."""
    fmt: ToolFormat | None
    schemas: dict = field(default_factory=dict)
    thinking: bool = False
    open_thinking: bool = False
    parallel: bool = True
    marks: reasoning.Marks = reasoning.THINK

    @property
    def active(self) -> bool:
        return self.fmt is not None or self.thinking

    def parse(self, text: str, partial: bool = False) -> Parsed:
        think = ""
        if self.thinking:
            think, text = reasoning.split(text, partial, self.open_thinking, self.marks)
        calls: list[ToolCall] = []
        if self.fmt is not None:
            text, calls, more = self.fmt.read(text, partial, self.schemas, self.thinking)
            think = f"{think}\n\n{more}" if think and more else think or more
        if not self.parallel:
            calls = calls[:1]
        return Parsed(text.strip(), tuple(calls), think)


class ReplyParser:
    """One answer's reader for a stream: `feed` each piece, `finish` at the end."""

    def __init__(self, spec: ReplySpec) -> None:
        self.spec = spec
        self.text = ""
        self.sent = Parsed("")
        self.ids: list[str] = []

    def feed(self, piece: str) -> Delta:
        self.text += piece
        return self._send(self.spec.parse(self.text, partial=True))

    def finish(self) -> Delta:
        return self._send(self.spec.parse(self.text))

    def _send(self, now: Parsed) -> Delta:
        out = Delta(_grown(self.sent.content, now.content),
                    _grown(self.sent.reasoning, now.reasoning))
        sent_calls = list(self.sent.calls)
        for i, call in enumerate(now.calls):
            if i < len(sent_calls):
                piece = _grown(sent_calls[i].arguments, call.arguments)
                if piece:
                    out.calls.append(CallDelta(i, None, None, piece))
                    sent_calls[i] = ToolCall(call.name, sent_calls[i].arguments + piece)
            else:
                call_ids(now.calls[:i + 1], self.ids)
                out.calls.append(CallDelta(i, self.ids[i], call.name, call.arguments))
                sent_calls.append(call)
        self.sent = Parsed(self.sent.content + out.content, tuple(sent_calls),
                           self.sent.reasoning + out.reasoning)
        return out

    @property
    def calls(self) -> list[tuple[str, ToolCall]]:
        """(id, call) of every call sent."""
        return list(zip(self.ids, self.sent.calls))


def _grown(before: str, now: str) -> str:
    """What `now` adds to `before`; nothing when it does not extend it (a call's text
    read differently at the end than while it streamed is not sent twice)."""
    return now[len(before):] if now.startswith(before) else ""

"""Tool calls and thinking on the chat routes: how an answer is read (a ReplySpec for
the template's call syntax, model/text/tool_calls/) and the grammar tool_choice adds
to the request (required or a named function: a well-formed call must come)."""

from __future__ import annotations

from dataclasses import replace

from ckptd.daemon.http.chat import ChatPrompt
from ckptd.daemon.http.errors import bad_request
from ckptd.daemon.http.schemas import Generate
from ckptd.model.sampling.grammar import STRUCTURAL_TAG, Constraint, modern_schema
from ckptd.model.text.tool_calls.base import ToolCall
from ckptd.model.text.tool_calls.constrain import structural_tag
from ckptd.model.text.tool_calls.reasoning import opens_thinking
from ckptd.model.text.tool_calls.reply import Delta, ReplySpec


def reply_spec(svc, chat: ChatPrompt, tokens: list[int]) -> ReplySpec:
    """How to read the answer to `chat`, whose prompt is `tokens`."""
    syntax = svc.prompts.tool_syntax()
    # (a mark such as <|START_THINKING|> is many tokens where it is no special token)
    open_thinking = syntax.thinking and opens_thinking(svc.tokenizer.decode(tokens[-32:]),
                                                       syntax.marks)
    calls = bool(chat.tools) and chat.tool_choice != "none" and syntax.fmt is not None
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {}
               for t in chat.tools} if calls else {}
    # a format that frames plain answers too reads them without tools (no call then)
    fmt = syntax.fmt if calls or (syntax.fmt is not None and syntax.fmt.frames_content) \
        else None
    thinking = syntax.thinking and chat.reasoning_format != "none"
    return ReplySpec(fmt, schemas, thinking, open_thinking,
                     chat.parallel_tool_calls and chat.tool_name is None, syntax.marks)


def with_tool_grammar(chat: ChatPrompt, spec: ReplySpec, g: Generate) -> Generate:
    """The request with the grammar its tool_choice asks for. A request's own grammar or
    schema stands beside tool_choice auto (calls are still read); beside a choice that
    forces a call it is a 400, as in llama-server."""
    if spec.fmt is None:
        return g
    # a request that turns thinking off gets calls only (a block still open is closed)
    thinking = spec.thinking and chat.enable_thinking is not False
    src = structural_tag(spec.fmt, chat.tools, chat.tool_choice, chat.tool_name,
                         spec.parallel, spec.open_thinking, thinking, modern_schema,
                         spec.marks)
    if src is None:
        return g
    if g.constraint is not None:
        raise bad_request(f"{g.constraint[0]} can not be combined with a tool_choice that "
                          "forces a tool call", g.constraint[0])
    return replace(g, constraint=("tools", Constraint(STRUCTURAL_TAG, src)))


def openai_calls(calls: list[tuple[str, ToolCall]]) -> list[dict]:
    return [{"id": cid, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for cid, c in calls]


def openai_delta(d: Delta) -> dict:
    """A stream delta in OpenAI's shape: a call's first piece carries id, type and name."""
    out: dict = {}
    if d.reasoning:
        out["reasoning_content"] = d.reasoning
    if d.content:
        out["content"] = d.content
    if d.calls:
        out["tool_calls"] = [
            {"index": c.index, "id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} if c.id is not None
            else {"index": c.index, "function": {"arguments": c.arguments}} for c in d.calls]
    return out

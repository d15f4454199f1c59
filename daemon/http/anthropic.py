"""Anthropic's Messages API: POST /v1/messages, /v1/messages/count_tokens.

Clients built for Claude (agents, SDKs) call llama-server here; ckptd reads a request
as the chat completion it amounts to, as llama-server does (system as a system
message, tool_use and tool_result blocks as tool calls and tool messages, thinking
blocks as reasoning_content, tools' input_schema as parameters) and answers in
Anthropic's shapes and named stream events. stop_reason follows Anthropic's
documentation: "stop_sequence" (with the string) when a stop sequence ended it.
"""

from __future__ import annotations

import json
import uuid

from aiohttp import web

from ckptd.daemon.generation import Result
from ckptd.daemon.http.common import blocking, json_response, read_json, ready
from ckptd.daemon.http.errors import ApiError, bad_request
from ckptd.daemon.http.fields import type_error
from ckptd.daemon.http.llama import stop_type
from ckptd.daemon.http.respond import run
from ckptd.daemon.http.schemas import ChatRequest
from ckptd.daemon.http.sse import Named
from ckptd.daemon.http.tools import reply_spec, with_tool_grammar
from ckptd.daemon.request import Finished, Progress
from ckptd.daemon.service import Service
from ckptd.model.sampling.decoding import TokenEvent
from ckptd.model.text.tool_calls.reply import Delta, ReplyParser, ReplySpec, call_id

DEFAULT_MAX_TOKENS = 4096          # required by Anthropic; llama-server's default without it
_PASS = ("temperature", "top_p", "top_k", "stream", "chat_template_kwargs", "seed",
         "cache_prompt", "id_slot", "return_progress", "timings_per_token")


def to_chat(body: object) -> dict:
    """The chat completion request an Anthropic request amounts to."""
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object", None, "invalid_type")
    if "messages" not in body:
        raise bad_request("messages is required", "messages", "missing_field")
    msgs = []
    system = body.get("system")
    if isinstance(system, list):
        system = "".join(b.get("text", "") for b in system
                         if isinstance(b, dict) and b.get("type") == "text")
    if system is not None:
        if not isinstance(system, str):
            raise type_error("system", "a string or a list of text blocks", system)
        msgs.append({"role": "system", "content": system})
    raw = body["messages"]
    if not isinstance(raw, list):
        raise type_error("messages", "a list of messages", raw)
    for i, m in enumerate(raw):
        msgs += _message(m, f"messages[{i}]")
    chat = {k: body[k] for k in _PASS if k in body}
    chat["messages"] = msgs
    chat["max_tokens"] = body.get("max_tokens", DEFAULT_MAX_TOKENS)
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise type_error("tools", "a list of tools", tools)
        chat["tools"] = [{"type": "function", "function": {
            "name": t.get("name"), "description": t.get("description", ""),
            "parameters": t.get("input_schema", {})}} for t in tools]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice.get("type")
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(kind) \
            or {"type": "function", "function": {"name": choice.get("name")}}
        if choice.get("disable_parallel_tool_use"):
            chat["parallel_tool_calls"] = False
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled"):
        kwargs = dict(chat.get("chat_template_kwargs") or {})
        kwargs.setdefault("enable_thinking", thinking["type"] == "enabled")
        chat["chat_template_kwargs"] = kwargs
    return chat


def _message(m: object, where: str) -> list[dict]:
    """One Anthropic message as chat messages: a user turn's tool results become tool
    messages (first: they answer the calls before them), its text a user message."""
    if not isinstance(m, dict):
        raise type_error(where, "an object", m)
    role, content = m.get("role"), m.get("content")
    if not isinstance(content, list):
        return [{"role": role, "content": content}]
    text, calls, results, thinking = [], [], [], ""
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            text.append({"type": "text", "text": b.get("text")})
        elif kind == "thinking":
            thinking += b.get("thinking") or ""
        elif kind == "redacted_thinking":
            continue                   # encrypted: nothing a template could show
        elif kind == "image":
            text.append(_image_part(b))
        elif kind == "tool_use":
            calls.append({"id": b.get("id"), "type": "function", "function": {
                "name": b.get("name"), "arguments": b.get("input") or {}}})
        elif kind == "tool_result":
            results.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                            "content": _result_text(b.get("content"), f"{where}.content[{j}]")})
        else:
            raise bad_request(f"{where}.content[{j}]: blocks of type {kind!r} are not "
                              "supported", f"{where}.content[{j}].type")
    out = list(results)
    if text or calls or thinking:
        msg = {"role": role, "content": text or ""}
        if calls:
            msg["tool_calls"] = calls
        if thinking:
            msg["reasoning_content"] = thinking
        out.append(msg)
    return out


def _image_part(b: dict) -> dict:
    """An image block as the chat part it amounts to: base64 data as a data URL, a URL
    as itself (the chat parser reads, or refuses, either)."""
    src = b.get("source") if isinstance(b.get("source"), dict) else {}
    if src.get("type") == "base64":
        url = f"data:{src.get('media_type') or 'image/png'};base64,{src.get('data') or ''}"
    else:
        url = src.get("url")
    return {"type": "image_url", "image_url": {"url": url}}


def _result_text(c: object, where: str) -> object:
    if c is None or isinstance(c, str):
        return c or ""
    if isinstance(c, list):
        parts = []
        for b in c:
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "image":
                parts.append(_image_part(b))
            elif kind == "text":
                parts.append({"type": "text", "text": b.get("text", "")})
        return parts
    raise type_error(where, "a string or a list of blocks", c)


class MessagesFormat:
    """Answers as content blocks: thinking, text and tool_use (from the answer read by
    its ReplySpec), streamed as each block's start, deltas and stop."""
    done_marker = False
    timings = None

    def __init__(self, svc: Service, jobs, spec: ReplySpec | None = None) -> None:
        self.svc, self.jobs = svc, jobs
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self.generated: list[int] = []
        self.text = ""
        self.spec = spec if spec is not None and spec.active else None
        self.parser = ReplyParser(self.spec) if self.spec else None
        self.block: str | None = None       # the kind of the open block
        self.index = -1                     # and its index
        self.calls = False

    def _usage(self, fin: Finished | None) -> dict:
        tokens = self.jobs[0][0]
        cached = 0 if fin is None else fin.stats.cache_n
        return {"input_tokens": len(tokens) - cached, "cache_read_input_tokens": cached,
                "cache_creation_input_tokens": 0,
                "output_tokens": 0 if fin is None else fin.stats.predicted_n}

    def _stop(self, fin: Finished) -> tuple[str, str | None]:
        kind, word = stop_type(self.svc, self.jobs[0][1], self.generated, self.text, fin)
        if kind == "limit":
            return "max_tokens", None
        if self.calls:
            return "tool_use", None
        return ("stop_sequence", word) if kind == "word" else ("end_turn", None)

    def _message(self, content: list, fin: Finished | None) -> dict:
        reason, seq = self._stop(fin) if fin is not None else (None, None)
        return {"id": self.id, "type": "message", "role": "assistant", "content": content,
                "model": self.svc.model_id, "stop_reason": reason, "stop_sequence": seq,
                "usage": self._usage(fin)}

    def opening(self, i: int) -> Named:
        return Named("message_start", {"type": "message_start",
                                       "message": self._message([], None)})

    def progress(self, i: int, ev: Progress) -> None:
        return None

    def _open(self, kind: str, block: dict) -> list[Named]:
        out = self._close()
        self.block, self.index = kind, self.index + 1
        return out + [Named("content_block_start", {"type": "content_block_start",
                                                    "index": self.index,
                                                    "content_block": block})]

    def _close(self) -> list[Named]:
        if self.block is None:
            return []
        self.block = None
        return [Named("content_block_stop", {"type": "content_block_stop",
                                             "index": self.index})]

    def _delta(self, delta: dict) -> Named:
        return Named("content_block_delta", {"type": "content_block_delta",
                                             "index": self.index, "delta": delta})

    def _events(self, d: Delta) -> list[Named]:
        out = []
        if d.reasoning:
            if self.block != "thinking":
                out += self._open("thinking", {"type": "thinking", "thinking": "",
                                               "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": d.reasoning}))
        if d.content:
            if self.block != "text":
                out += self._open("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": d.content}))
        for c in d.calls:
            if c.id is not None:
                self.calls = True
                out += self._open("tool_use", {"type": "tool_use", "id": _tool_id(c.id),
                                               "name": c.name, "input": {}})
            if c.arguments:
                out.append(self._delta({"type": "input_json_delta",
                                        "partial_json": c.arguments}))
        return out

    def chunk(self, i: int, ev: TokenEvent) -> list[Named] | None:
        self.generated.append(ev.token)
        if not ev.text:
            return None
        self.text += ev.text
        d = self.parser.feed(ev.text) if self.parser else Delta(content=ev.text)
        return self._events(d) or None

    def closing(self, i: int, fin: Finished) -> list[Named]:
        out = self._events(self.parser.finish()) if self.parser else []
        if self.index < 0:              # an empty answer still has its (empty) text block
            out += self._open("text", {"type": "text", "text": ""})
        reason, seq = self._stop(fin)
        return out + self._close() + [
            Named("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": reason, "stop_sequence": seq},
                                    "usage": {"output_tokens": fin.stats.predicted_n}}),
            Named("message_stop", {"type": "message_stop"})]

    def usage(self, fins: list[Finished]) -> None:
        return None

    def error(self, err: ApiError) -> Named:
        return Named("error", {"type": "error", "error": {"type": err.kind,
                                                          "message": err.message}})

    def body(self, results: list[Result]) -> dict:
        res = results[0]
        self.generated = list(res.tokens)
        self.text = res.text
        if self.spec is None:
            return self._message([{"type": "text", "text": self.text}], res.finished)
        parsed = self.spec.parse(self.text)
        blocks = [{"type": "thinking", "thinking": parsed.reasoning, "signature": ""}] \
            if parsed.reasoning else []
        if parsed.content or not parsed.calls:
            blocks.append({"type": "text", "text": parsed.content})
        for c in parsed.calls:
            blocks.append({"type": "tool_use", "id": _tool_id(call_id()), "name": c.name,
                           "input": _input(c.arguments)})
        self.calls = bool(parsed.calls)
        return self._message(blocks, res.finished)


def _tool_id(cid: str) -> str:
    return "toolu_" + cid.removeprefix("call_")


def _input(arguments: str) -> object:
    try:
        return json.loads(arguments)
    except ValueError:              # a call cut short reads as text, not as an input
        return {}


def _request(svc: Service, body: object) -> ChatRequest:
    return ChatRequest.parse(to_chat(body), svc.parse_openai, allow_empty=True)


async def messages(request: web.Request) -> web.StreamResponse:
    svc = ready(request)
    req = _request(svc, await read_json(request))
    prompt = await blocking(svc.chat_prompt, req.chat, req.gen.cache)
    spec = reply_spec(svc, req.chat, prompt.tokens)
    return await run(request, svc, [prompt], prompt.salt,
                     with_tool_grammar(req.chat, spec, req.gen),
                     lambda jobs: MessagesFormat(svc, jobs, spec), "messages")


async def count_tokens(request: web.Request) -> web.Response:
    svc = ready(request)
    body = await read_json(request)
    if isinstance(body, dict):
        body = {**body, "max_tokens": 1}         # not required here
    req = _request(svc, body)
    tokens, _ = await blocking(svc.chat_tokens, req.chat, req.gen.cache)
    return json_response({"input_tokens": len(tokens)})

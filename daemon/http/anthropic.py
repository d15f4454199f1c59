"""Anthropic's Messages API: POST /v1/messages, /v1/messages/count_tokens.

Clients built for Claude (agents, SDKs) call llama-server here; ckptd reads a request
as the chat it amounts to (anthropic_request.py, errors naming Anthropic's fields) and
answers in Anthropic's shapes and named stream events. stop_reason follows Anthropic's
documentation: "stop_sequence" (with the string) when a stop sequence ended it.
"""

from __future__ import annotations

import json
import uuid

from aiohttp import web

from ckptd.daemon.generation import Result
from ckptd.daemon.http import anthropic_request
from ckptd.daemon.http.common import json_response
from ckptd.daemon.http.errors import ApiError
from ckptd.daemon.http.pipeline import count, generate
from ckptd.daemon.http.report import stop_type, verbose
from ckptd.daemon.http.sse import Named
from ckptd.daemon.request import Finished, Progress
from ckptd.daemon.service import Service
from ckptd.model.sampling.decoding import TokenEvent
from ckptd.model.text.tool_calls.reply import Delta, ReplyParser, ReplySpec, call_id


class MessagesFormat:
    """Answers as content blocks: thinking, text and tool_use (from the answer read by
    its ReplySpec), streamed as each block's start, deltas and stop."""
    done_marker = False
    timings = None

    def __init__(self, svc: Service, jobs, spec: ReplySpec | None = None,
                 verbose: bool = False) -> None:
        self.svc, self.jobs, self.verbose = svc, jobs, verbose
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
        out = self._message(self._blocks(), res.finished)
        if self.verbose:
            out["__verbose"] = verbose(self.svc, self.jobs[0], res, False)
        return out

    def _blocks(self) -> list[dict]:
        if self.spec is None:
            return [{"type": "text", "text": self.text}]
        parsed = self.spec.parse(self.text)
        blocks = [{"type": "thinking", "thinking": parsed.reasoning, "signature": ""}] \
            if parsed.reasoning else []
        if parsed.content or not parsed.calls:
            blocks.append({"type": "text", "text": parsed.content})
        for c in parsed.calls:
            blocks.append({"type": "tool_use", "id": _tool_id(call_id()), "name": c.name,
                           "input": _input(c.arguments)})
        self.calls = bool(parsed.calls)
        return blocks


def _tool_id(cid: str) -> str:
    # Anthropic's ids are letters, digits, _ and -: a model's own id in other
    # characters (Kimi K2's functions.NAME:0) gets one of ckptd's
    if not cid.replace("_", "").replace("-", "").isalnum() or not cid.isascii():
        cid = call_id()
    return "toolu_" + cid.removeprefix("call_")


def _input(arguments: str) -> object:
    try:
        return json.loads(arguments)
    except ValueError:              # a call cut short reads as text, not as an input
        return {}


async def messages(request: web.Request) -> web.StreamResponse:
    return await generate(request, anthropic_request.parse,
                          lambda svc, p, jobs: MessagesFormat(svc, jobs, p.spec,
                                                             p.req.gen.verbose))


async def count_tokens(request: web.Request) -> web.Response:
    return json_response({"input_tokens": await count(request, anthropic_request.parse)})

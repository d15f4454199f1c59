"""OpenAI's Responses API: POST /v1/responses (and /responses), /v1/responses/input_tokens.

A request is read as the chat completion it amounts to (llama-server does the same:
input items become messages, instructions a system message, function tools chat
tools) and answered in the Responses shapes. Where llama-server and OpenAI's
documentation differ, the documentation wins: an answer cut by max_output_tokens is
"incomplete" (its stream ends with response.incomplete), every event carries its
sequence_number. llama-server's telemetry rides along: prompt_progress on
response.in_progress events, timings on deltas (timings_per_token) and at the end.
"""

from __future__ import annotations

import time
import uuid

from aiohttp import web

from ckptd.daemon.cachefields import prompt_details
from ckptd.daemon.generation import Result
from ckptd.daemon.http.common import blocking, json_response, read_json, ready
from ckptd.daemon.http.errors import ApiError, bad_request
from ckptd.daemon.http.fields import type_error
from ckptd.daemon.http.respond import prompt_progress, run
from ckptd.daemon.http.schemas import ChatRequest
from ckptd.daemon.http.sse import Named
from ckptd.daemon.http.tools import reply_spec, with_tool_grammar
from ckptd.daemon.request import Finished, Progress
from ckptd.daemon.service import Service
from ckptd.model.sampling.decoding import TokenEvent
from ckptd.model.text.tool_calls.base import ToolCall
from ckptd.model.text.tool_calls.reply import ReplyParser, ReplySpec, call_id

_ROLES = ("user", "system", "developer", "assistant")


def to_chat(body: object) -> dict:
    """The chat completion request a Responses request amounts to."""
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object", None, "invalid_type")
    if body.get("previous_response_id"):
        raise bad_request("previous_response_id: responses are not stored by this server "
                          "(ckptd); send the conversation as input", "previous_response_id",
                          "not_supported")
    if "input" not in body:
        raise bad_request("input is required", "input", "missing_field")
    chat = {k: v for k, v in body.items() if k not in (
        "input", "instructions", "max_output_tokens", "reasoning", "text", "tools", "store",
        "metadata", "include", "truncation", "user", "background", "service_tier")}
    msgs = [{"role": "system", "content": body["instructions"]}] \
        if body.get("instructions") is not None else []
    msgs += _messages(body["input"])
    chat["messages"] = msgs
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "output"), "schema": fmt.get("schema")}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise type_error("tools", "a list of tools", tools)
        for i, t in enumerate(tools):
            if t.get("type") != "function":
                raise bad_request(f"tools[{i}]: only function tools are supported by this "
                                  "server (ckptd)", f"tools[{i}].type", "not_supported")
        chat["tools"] = [{"type": "function", "function": {
            k: v for k, v in t.items() if k != "type"}} for t in tools]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    if body.get("truncation") not in (None, "disabled"):
        raise bad_request("truncation: only 'disabled' is supported (a prompt longer than the "
                          "context is an error)", "truncation", "not_supported")
    return chat


def _messages(v: object) -> list[dict]:
    if isinstance(v, str):
        return [{"role": "user", "content": v}]
    if not isinstance(v, list):
        raise type_error("input", "a string or a list of input items", v)
    out: list[dict] = []
    for i, item in enumerate(v):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise type_error(where, "an object", item)
        kind = item.get("type", "message")
        last = out[-1] if out else None
        if kind == "message" and item.get("role") in _ROLES:
            msg = {"role": item["role"], "content": _parts(item.get("content"), where)}
            if item["role"] == "assistant" and last is not None and \
                    last["role"] == "assistant" and not last.get("content"):
                last["content"] = msg["content"]        # one turn: calls, then its text
            else:
                out.append(msg)
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function", "function": {
                "name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": _parts(item.get("output"), f"{where}.output")})
        elif kind == "reasoning":
            text = "".join(c.get("text", "") for c in item.get("content") or []
                           if isinstance(c, dict))
            if last is not None and last["role"] == "assistant":
                last["reasoning_content"] = text
            else:
                out.append({"role": "assistant", "content": "", "reasoning_content": text})
        else:
            raise bad_request(f"{where}: an item of type {kind!r} is not supported", where)
    return out


def _parts(c: object, where: str) -> object:
    """Responses content parts as chat parts (input_image an image_url part)."""
    if c is None or isinstance(c, str):
        return c
    if not isinstance(c, list):
        raise type_error(where, "a string or a list of content parts", c)
    out = []
    for p in c:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in ("input_text", "output_text", "text"):
            out.append({"type": "text", "text": p.get("text")})
        elif kind == "input_image":
            out.append({"type": "image_url", "image_url": {"url": p.get("image_url")}})
        else:
            raise bad_request(f"{where}: content parts of type {kind!r} are not supported",
                              where)
    return out


class ResponsesFormat:
    done_marker = False
    timings = None

    def __init__(self, svc: Service, jobs, request_body: dict,
                 spec: ReplySpec | None = None) -> None:
        self.svc, self.jobs, self.asked = svc, jobs, request_body
        self.spec = spec if spec is not None and spec.active else None
        self.parser = ReplyParser(self.spec) if self.spec else None
        self.calls: list[tuple[str, ToolCall]] = []
        self.reasoning = ""
        self.id = f"resp_{uuid.uuid4().hex}"
        self.msg_id = f"msg_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.seq = 0
        self.text = ""

    def _event(self, kind: str, **data) -> Named:
        self.seq += 1
        return Named(kind, {"type": kind, "sequence_number": self.seq - 1, **data})

    def _message(self, status: str) -> dict:
        content = [] if status == "in_progress" else [self._part()]
        return {"type": "message", "id": self.msg_id, "status": status, "role": "assistant",
                "content": content}

    def _part(self) -> dict:
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}

    def response(self, fin: Finished | None) -> dict:
        b = self.asked
        out = {"id": self.id, "object": "response", "created_at": self.created,
               "status": "in_progress", "model": self.svc.model_id, "output": [],
               "error": None, "incomplete_details": None,
               "instructions": b.get("instructions"),
               "max_output_tokens": b.get("max_output_tokens"),
               "temperature": b.get("temperature"), "top_p": b.get("top_p"),
               "tool_choice": b.get("tool_choice", "auto"), "tools": b.get("tools") or [],
               "parallel_tool_calls": b.get("parallel_tool_calls", True),
               "text": b.get("text") or {"format": {"type": "text"}},
               "metadata": b.get("metadata") or {}, "usage": None}
        if fin is None:
            return out
        cut = fin.reason == "length"
        st = fin.stats
        out.update(status="incomplete" if cut else "completed",
                   incomplete_details={"reason": "max_output_tokens"} if cut else None,
                   output=[self._message("incomplete" if cut else "completed")] +
                   [self._call(cid, c) for cid, c in self.calls] + self._reasoning(),
                   usage={"input_tokens": st.prompt_n, "output_tokens": st.predicted_n,
                          "total_tokens": st.prompt_n + st.predicted_n,
                          "input_tokens_details": {"cached_tokens": st.cache_n,
                                                   **prompt_details([st])},
                          "output_tokens_details": {"reasoning_tokens": 0}})
        if not cut:
            out["completed_at"] = int(time.time())
        return out

    def _reasoning(self) -> list[dict]:
        """The thinking block as a reasoning item (after the others: a stream has sent
        the message as item 0 before the end tells the rest)."""
        if not self.reasoning:
            return []
        return [{"type": "reasoning", "id": f"rs_{self.id[5:]}", "summary": [],
                 "content": [{"type": "reasoning_text", "text": self.reasoning}]}]

    @staticmethod
    def _call(cid: str, c: ToolCall) -> dict:
        return {"type": "function_call", "id": "fc_" + cid.removeprefix("call_"),
                "call_id": cid, "name": c.name, "arguments": c.arguments,
                "status": "completed"}

    def opening(self, i: int) -> list[Named]:
        first = self.response(None)
        return [self._event("response.created", response=first),
                self._event("response.in_progress", response=first),
                self._event("response.output_item.added", output_index=0,
                            item=self._message("in_progress")),
                self._event("response.content_part.added", item_id=self.msg_id,
                            output_index=0, content_index=0,
                            part={"type": "output_text", "text": "", "annotations": []})]

    def progress(self, i: int, ev: Progress) -> Named:
        out = self._event("response.in_progress", response=self.response(None))
        out.data["prompt_progress"] = prompt_progress(ev)
        return out

    def chunk(self, i: int, ev: TokenEvent) -> Named | None:
        text = self.parser.feed(ev.text).content if self.parser else ev.text
        if not text:
            return None
        self.text += text
        out = self._event("response.output_text.delta", item_id=self.msg_id, output_index=0,
                          content_index=0, delta=text, logprobs=[])
        if self.timings is not None:
            out.data["timings"] = self.timings[i].timings()
        return out

    def closing(self, i: int, fin: Finished) -> list[Named]:
        out = []
        if self.parser is not None:
            rest = self.parser.finish().content
            if rest:
                self.text += rest
                out.append(self._event("response.output_text.delta", item_id=self.msg_id,
                                       output_index=0, content_index=0, delta=rest,
                                       logprobs=[]))
            self.calls = self.parser.calls
            self.reasoning = self.parser.sent.reasoning
        final = self.response(fin)
        out += [self._event("response.output_text.done", item_id=self.msg_id, output_index=0,
                           content_index=0, text=self.text, logprobs=[]),
               self._event("response.content_part.done", item_id=self.msg_id,
                           output_index=0, content_index=0, part=self._part()),
               self._event("response.output_item.done", output_index=0,
                           item=final["output"][0])]
        for k, item in enumerate(final["output"][1:], 1):
            if item["type"] != "function_call":
                out += [self._event("response.output_item.added", output_index=k, item=item),
                        self._event("response.output_item.done", output_index=k, item=item)]
                continue
            added = {**item, "status": "in_progress", "arguments": ""}
            out += [self._event("response.output_item.added", output_index=k, item=added),
                    self._event("response.function_call_arguments.delta", item_id=item["id"],
                                output_index=k, delta=item["arguments"]),
                    self._event("response.function_call_arguments.done", item_id=item["id"],
                                output_index=k, arguments=item["arguments"]),
                    self._event("response.output_item.done", output_index=k, item=item)]
        out += [self._event("response.incomplete" if final["status"] == "incomplete"
                           else "response.completed", response=final)]
        out[-1].data["timings"] = fin.stats.timings()
        return out

    def usage(self, fins: list[Finished]) -> None:
        return None

    def error(self, err: ApiError) -> Named:
        return self._event("error", code=err.code, message=err.message, param=err.param)

    def body(self, results: list[Result]) -> dict:
        res = results[0]
        self.text = "".join(e.text for e in res.events)
        if self.spec is not None:
            parsed = self.spec.parse(self.text)
            self.text, self.reasoning = parsed.content, parsed.reasoning
            self.calls = [(call_id(), c) for c in parsed.calls]
        out = self.response(res.finished)
        out["timings"] = res.finished.stats.timings()
        return out


async def responses(request: web.Request) -> web.StreamResponse:
    svc = ready(request)
    body = await read_json(request)
    req = ChatRequest.parse(to_chat(body), svc.parse_openai)
    if req.gen.n != 1:
        raise bad_request("n is not a field of the Responses API", "n")
    prompt = await blocking(svc.chat_prompt, req.chat, req.gen.cache)
    spec = reply_spec(svc, req.chat, prompt.tokens)
    return await run(request, svc, [prompt], prompt.salt,
                     with_tool_grammar(req.chat, spec, req.gen),
                     lambda jobs: ResponsesFormat(svc, jobs, body, spec), "input")


async def input_tokens(request: web.Request) -> web.Response:
    """How many tokens a Responses request's prompt is, without generating."""
    svc = ready(request)
    req = ChatRequest.parse(to_chat(await read_json(request)), svc.parse_openai)
    tokens, _ = await blocking(svc.chat_tokens, req.chat, req.gen.cache)
    return json_response({"object": "response.input_tokens", "input_tokens": len(tokens)})

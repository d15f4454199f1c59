"""OpenAI's Responses API: POST /v1/responses (and /responses), /v1/responses/input_tokens.

A request is read as the chat it amounts to (responses_request.py, errors naming the
Responses API's fields) and answered in the Responses shapes. Where llama-server and OpenAI's
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
from ckptd.daemon.http import logprobs, responses_request
from ckptd.daemon.http.common import json_response
from ckptd.daemon.http.errors import ApiError
from ckptd.daemon.http.pipeline import count, generate
from ckptd.daemon.http.report import verbose
from ckptd.daemon.http.respond import prompt_progress
from ckptd.daemon.http.sse import Named
from ckptd.daemon.request import Finished, Progress
from ckptd.daemon.service import Service
from ckptd.model.sampling.decoding import TokenEvent
from ckptd.model.text.tool_calls.base import ToolCall
from ckptd.model.text.tool_calls.reply import ReplyParser, ReplySpec, call_ids


class ResponsesFormat:
    done_marker = False
    timings = None

    def __init__(self, svc: Service, jobs, request_body: dict,
                 spec: ReplySpec | None = None, verbose: bool = False) -> None:
        self.svc, self.jobs, self.asked, self.verbose = svc, jobs, request_body, verbose
        self.spec = spec if spec is not None and spec.active else None
        self.parser = ReplyParser(self.spec) if self.spec else None
        self.calls: list[tuple[str, ToolCall]] = []
        self.reasoning = ""
        self.id = f"resp_{uuid.uuid4().hex}"
        self.msg_id = f"msg_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.seq = 0
        self.text = ""
        self.logprobs: list[dict] = []      # of every token, with top_logprobs

    def _event(self, kind: str, **data) -> Named:
        self.seq += 1
        return Named(kind, {"type": kind, "sequence_number": self.seq - 1, **data})

    def _message(self, status: str) -> dict:
        content = [] if status == "in_progress" else [self._part()]
        return {"type": "message", "id": self.msg_id, "status": status, "role": "assistant",
                "content": content}

    def _part(self) -> dict:
        return {"type": "output_text", "text": self.text, "annotations": [],
                "logprobs": self.logprobs}

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
        # a token's logprobs go out with it, also when its text is held back or empty
        lps = logprobs.chat_list(self.svc.tokenizer, [ev]) or []
        self.logprobs += lps
        text = self.parser.feed(ev.text).content if self.parser else ev.text
        if not text and not lps:
            return None
        self.text += text
        out = self._event("response.output_text.delta", item_id=self.msg_id, output_index=0,
                          content_index=0, delta=text, logprobs=lps)
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
                           content_index=0, text=self.text, logprobs=self.logprobs),
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
        self.logprobs = logprobs.chat_list(self.svc.tokenizer, res.events) or []
        if self.spec is not None:
            parsed = self.spec.parse(self.text)
            self.text, self.reasoning = parsed.content, parsed.reasoning
            self.calls = list(zip(call_ids(parsed.calls), parsed.calls))
        out = self.response(res.finished)
        out["timings"] = res.finished.stats.timings()
        if self.verbose:
            out["__verbose"] = verbose(self.svc, self.jobs[0], res, False)
        return out


async def responses(request: web.Request) -> web.StreamResponse:
    return await generate(request, responses_request.parse,
                          lambda svc, p, jobs: ResponsesFormat(svc, jobs, p.req.options, p.spec,
                                                               p.req.gen.verbose))


async def input_tokens(request: web.Request) -> web.Response:
    """How many tokens a Responses request's prompt is, without generating."""
    return json_response({"object": "response.input_tokens",
                          "input_tokens": await count(request, responses_request.parse)})

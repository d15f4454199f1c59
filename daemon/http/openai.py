"""OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions, /v1/models (and
llama-server's un-prefixed /chat/completions, /models).

Where llama-server and OpenAI's documentation disagree on these routes, OpenAI's
documentation wins: the usage chunk of a stream comes only with
stream_options.include_usage (the last choice chunk carries `timings` anyway).
"""

from __future__ import annotations

import time
import uuid

from aiohttp import web

from ckptd.daemon.cachefields import prompt_details
from ckptd.daemon.generation import Result
from ckptd.daemon.http import logprobs
from ckptd.daemon.http.common import json_response, service
from ckptd.daemon.http.errors import ApiError
from ckptd.daemon.http.pipeline import count, generate
from ckptd.daemon.http.report import verbose
from ckptd.daemon.http.respond import prompt_progress
from ckptd.daemon.http.schemas import ApiRequest, openai_chat, openai_completion
from ckptd.daemon.http.tools import openai_calls, openai_delta
from ckptd.daemon.request import Finished, Progress
from ckptd.daemon.service import Service
from ckptd.model.sampling.decoding import TokenEvent
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.text.tool_calls.reply import ReplyParser, ReplySpec, call_ids


def usage(fins: list[Finished], jobs: list[tuple[list[int], SamplingParams]],
          prefill_only: bool) -> dict:
    """Prompt tokens once per distinct prompt (n copies share one), completions summed."""
    seen, prompt_n, cached, firsts = set(), 0, 0, []
    for (tokens, _), fin in zip(jobs, fins):
        key = tuple(tokens)
        if key not in seen:
            seen.add(key)
            prompt_n += len(tokens)
            cached += fin.stats.cache_n
            firsts.append(fin.stats)
    done = 0 if prefill_only else sum(f.stats.predicted_n for f in fins)
    return {"prompt_tokens": prompt_n, "completion_tokens": done, "total_tokens": prompt_n + done,
            "prompt_tokens_details": {"cached_tokens": cached, **prompt_details(firsts)}}


class _Base:
    """What both OpenAI formats share: ids, usage, timings, a prefill-only request."""

    done_marker = True
    timings = None              # live stats, with timings_per_token (respond.run)
    prefix = "cmpl"
    object_name = ""            # of a whole answer
    chunk_object = ""           # of a stream chunk

    def __init__(self, svc: Service, jobs: list[tuple[list[int], SamplingParams]],
                 prefill_only: bool, verbose: bool = False) -> None:
        self.svc, self.jobs, self.prefill_only = svc, jobs, prefill_only
        self.verbose = verbose
        self.id = f"{self.prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created,
                "model": self.svc.model_id, "system_fingerprint": self.svc.system_fingerprint}

    def piece(self, token: int) -> str:
        return self.svc.tokenizer.decode([token])

    @staticmethod
    def finish_reason(fin: Finished) -> str:
        return fin.reason if fin.reason in ("stop", "length") else "stop"

    def progress(self, i: int, ev: Progress) -> dict | None:
        return {**self.head(self.chunk_object), "choices": [],
                "prompt_progress": prompt_progress(ev)}

    def error(self, err: ApiError) -> dict:
        return err.body()

    def timed(self, i: int, out: dict) -> dict:
        """A chunk with the generation's timings so far, when the request asked."""
        if self.timings is not None:
            out["timings"] = self.timings[i].timings()
        return out

    def usage(self, fins: list[Finished]) -> dict:
        return {**self.head(self.chunk_object), "choices": [],
                "usage": usage(fins, self.jobs, self.prefill_only),
                "timings": fins[0].stats.timings() if fins else {}}

    def _whole(self, results: list[Result], choices: list[dict]) -> dict:
        fins = [r.finished for r in results]
        out = {**self.head(self.object_name), "choices": choices,
               "usage": usage(fins, self.jobs, self.prefill_only),
               "timings": fins[0].stats.timings()}
        if self.verbose:
            out["__verbose"] = verbose(self.svc, self.jobs[0], results[0], self.prefill_only)
        return out


class CompletionFormat(_Base):
    object_name = chunk_object = "text_completion"

    def __init__(self, svc: Service, jobs, prefill_only: bool, verbose: bool = False) -> None:
        super().__init__(svc, jobs, prefill_only, verbose)
        self.offsets = [0] * len(jobs)

    def _logprobs(self, i: int, evs: list[TokenEvent]) -> dict | None:
        out, self.offsets[i] = logprobs.completion(self.svc.tokenizer, evs, self.offsets[i])
        return out

    def opening(self, i: int) -> dict | None:
        return None

    def chunk(self, i: int, ev: TokenEvent) -> dict | None:
        if self.prefill_only:
            return None
        return self.timed(i, {**self.head(self.chunk_object), "choices": [
            {"text": ev.text, "index": i, "logprobs": self._logprobs(i, [ev]),
             "finish_reason": None}]})

    def closing(self, i: int, fin: Finished) -> dict:
        return {**self.head(self.chunk_object), "choices": [
            {"text": "", "index": i, "logprobs": None,
             "finish_reason": self.finish_reason(fin)}], "timings": fin.stats.timings()}

    def body(self, results: list[Result]) -> dict:
        choices = []
        for i, res in enumerate(results):
            evs = [] if self.prefill_only else res.events
            choices.append({"text": "".join(e.text for e in evs), "index": i,
                            "logprobs": self._logprobs(i, evs),
                            "finish_reason": self.finish_reason(res.finished)})
        return self._whole(results, choices)


class ChatFormat(_Base):
    """Chat answers; with a ReplySpec that reads something (tools, thinking), the text is
    split into reasoning_content, content and tool_calls, in the stream as it comes."""
    prefix = "chatcmpl"
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, svc: Service, jobs, prefill_only: bool, verbose: bool = False,
                 spec: ReplySpec | None = None) -> None:
        super().__init__(svc, jobs, prefill_only, verbose)
        self.spec = spec if spec is not None and spec.active else None
        self.parsers = [ReplyParser(self.spec) for _ in jobs] if self.spec else None

    def _logprobs(self, evs: list[TokenEvent]) -> dict | None:
        return logprobs.chat(self.svc.tokenizer, evs)

    def _chunk(self, i: int, delta: dict, lps=None, finish: str | None = None) -> dict:
        return {**self.head(self.chunk_object), "choices": [
            {"index": i, "delta": delta, "logprobs": lps, "finish_reason": finish}]}

    def opening(self, i: int) -> dict:
        return self._chunk(i, {"role": "assistant", "content": None})

    def chunk(self, i: int, ev: TokenEvent) -> dict | None:
        if self.prefill_only:
            return None
        lps = self._logprobs([ev])
        if self.parsers is not None:
            delta = openai_delta(self.parsers[i].feed(ev.text))
            if not delta and lps is None:
                return None
        elif not ev.text and lps is None:
            return None
        else:
            delta = {"content": ev.text}
        return self.timed(i, self._chunk(i, delta, lps))

    def _reason(self, fin: Finished, calls: bool) -> str:
        reason = self.finish_reason(fin)
        return "tool_calls" if calls and reason == "stop" else reason

    def closing(self, i: int, fin: Finished) -> dict | list[dict]:
        if self.parsers is None:
            return {**self._chunk(i, {}, None, self.finish_reason(fin)),
                    "timings": fin.stats.timings()}
        parser = self.parsers[i]
        rest = openai_delta(parser.finish())
        last = {**self._chunk(i, {}, None, self._reason(fin, bool(parser.calls))),
                "timings": fin.stats.timings()}
        return [self._chunk(i, rest), last] if rest else last

    def _message(self, text: str) -> tuple[dict, bool]:
        if self.spec is None:
            return {"role": "assistant", "content": text}, False
        parsed = self.spec.parse(text)
        calls = list(zip(call_ids(parsed.calls), parsed.calls))
        msg = {"role": "assistant", "content": parsed.content or (None if calls else "")}
        if parsed.reasoning:
            msg["reasoning_content"] = parsed.reasoning
        if calls:
            msg["tool_calls"] = openai_calls(calls)
        return msg, bool(calls)

    def body(self, results: list[Result]) -> dict:
        choices = []
        for i, res in enumerate(results):
            evs = [] if self.prefill_only else res.events
            msg, calls = self._message("".join(e.text for e in evs))
            choices.append({"index": i, "message": msg, "logprobs": self._logprobs(evs),
                            "finish_reason": self._reason(res.finished, calls)})
        return self._whole(results, choices)


def _completion(body: object, svc: Service) -> ApiRequest:
    return openai_completion(body, svc.parse_openai)


def _chat(body: object, svc: Service) -> ApiRequest:
    return openai_chat(body, svc.parse_openai)


async def completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, _completion, lambda svc, p, jobs: CompletionFormat(
        svc, jobs, p.req.gen.max_tokens == 0, p.req.gen.verbose))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, _chat, lambda svc, p, jobs: ChatFormat(
        svc, jobs, p.req.gen.max_tokens == 0, p.req.gen.verbose, p.spec))


async def chat_input_tokens(request: web.Request) -> web.Response:
    """How many tokens a chat request's prompt is, without generating."""
    return json_response({"input_tokens": await count(request, _chat)})


async def models(request: web.Request) -> web.Response:
    svc = service(request)
    entry = {"id": svc.model_id, "object": "model", "created": int(svc.started),
             "owned_by": "ckptd", "aliases": svc.aliases, "tags": svc.cfg.tag_list}
    if svc.rt is not None:
        cfg = svc.rt.config            # kept while the model sleeps
        entry["meta"] = {"arch": cfg.arch, "n_vocab": cfg.vocab_size, "n_ctx": svc.max_context,
                         "n_ctx_train": cfg.max_position_embeddings,
                         "n_layers": len(cfg.layer_types), "fingerprint": svc.rt.fingerprint}
    # llama-server's list beside OpenAI's: what the model takes ("multimodal": images)
    caps = ["completion"] + (["multimodal"] if svc.vision else [])
    entry["capabilities"] = caps
    listed = {"name": svc.model_id, "model": svc.model_id, "type": "model",
              "tags": svc.cfg.tag_list, "capabilities": caps}
    return json_response({"object": "list", "data": [entry], "models": [listed]})

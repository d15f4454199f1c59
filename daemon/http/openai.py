"""OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

import time
import uuid

from aiohttp import web

from ckptd.daemon.generation import Result
from ckptd.daemon.http.common import blocking, json_response, read_json, ready, service
from ckptd.daemon.http.respond import answer
from ckptd.daemon.http.schemas import ChatRequest, CompletionRequest
from ckptd.daemon.request import Finished, Stats
from ckptd.daemon.service import Service
from ckptd.model.sampling.decoding import TokenEvent


def usage(prompt_n: int, stats: Stats, completion_n: int) -> dict:
    return {"prompt_tokens": prompt_n, "completion_tokens": completion_n,
            "total_tokens": prompt_n + completion_n,
            "prompt_tokens_details": {"cached_tokens": stats.cache_n}}


class _Base:
    """What both OpenAI formats share: ids, usage, timings, a prefill-only request."""

    done_marker = True
    prefix = "cmpl"
    object_name = ""            # of a whole answer
    chunk_object = ""           # of a stream chunk

    def __init__(self, svc: Service, prompt_n: int, prefill_only: bool) -> None:
        self.svc, self.prompt_n, self.prefill_only = svc, prompt_n, prefill_only
        self.id = f"{self.prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created,
                "model": self.svc.model_id}

    def piece(self, token: int) -> str:
        return self.svc.tokenizer.decode([token])

    def completion_n(self, fin: Finished) -> int:
        return 0 if self.prefill_only else fin.stats.predicted_n

    def finish_reason(self, fin: Finished) -> str:
        return fin.reason if fin.reason in ("stop", "length") else "stop"

    def usage(self, fin: Finished) -> dict:
        return {**self.head(self.chunk_object), "choices": [],
                "usage": usage(self.prompt_n, fin.stats, self.completion_n(fin)),
                "timings": fin.stats.timings()}


class CompletionFormat(_Base):
    object_name = chunk_object = "text_completion"

    def __init__(self, svc: Service, prompt_n: int, prefill_only: bool) -> None:
        super().__init__(svc, prompt_n, prefill_only)
        self.offset = 0

    def _logprobs(self, evs: list[TokenEvent]) -> dict | None:
        if not evs or evs[0].sampled.logprob is None:
            return None
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for ev in evs:
            s = ev.sampled
            out["tokens"].append(self.piece(s.token))
            out["token_logprobs"].append(s.logprob)
            out["top_logprobs"].append({self.piece(t): lp for t, lp in s.top})
            out["text_offset"].append(self.offset)
            self.offset += len(ev.text)
        return out

    def opening(self) -> dict | None:
        return None

    def chunk(self, ev: TokenEvent) -> dict | None:
        if self.prefill_only:
            return None
        return {**self.head(self.chunk_object), "choices": [
            {"text": ev.text, "index": 0, "logprobs": self._logprobs([ev]),
             "finish_reason": None}]}

    def closing(self, fin: Finished) -> dict:
        return {**self.head(self.chunk_object), "choices": [
            {"text": "", "index": 0, "logprobs": None,
             "finish_reason": self.finish_reason(fin)}]}

    def body(self, res: Result) -> dict:
        fin = res.finished
        evs = [] if self.prefill_only else res.events
        return {**self.head(self.object_name), "choices": [
            {"text": "".join(e.text for e in evs), "index": 0, "logprobs": self._logprobs(evs),
             "finish_reason": self.finish_reason(fin)}],
            "usage": usage(self.prompt_n, fin.stats, self.completion_n(fin)),
            "timings": fin.stats.timings()}


class ChatFormat(_Base):
    prefix = "chatcmpl"
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def _entry(self, token: int, lp: float) -> dict:
        text = self.piece(token)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    def _logprobs(self, evs: list[TokenEvent]) -> dict | None:
        if not evs or evs[0].sampled.logprob is None:
            return None
        return {"content": [{**self._entry(e.sampled.token, e.sampled.logprob),
                             "top_logprobs": [self._entry(t, lp) for t, lp in e.sampled.top]}
                            for e in evs]}

    def _chunk(self, delta: dict, logprobs=None, finish: str | None = None) -> dict:
        return {**self.head(self.chunk_object), "choices": [
            {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

    def opening(self) -> dict:
        return self._chunk({"role": "assistant", "content": ""})

    def chunk(self, ev: TokenEvent) -> dict | None:
        if self.prefill_only or (not ev.text and ev.sampled.logprob is None):
            return None
        return self._chunk({"content": ev.text}, self._logprobs([ev]))

    def closing(self, fin: Finished) -> dict:
        return self._chunk({}, None, self.finish_reason(fin))

    def body(self, res: Result) -> dict:
        fin = res.finished
        evs = [] if self.prefill_only else res.events
        return {**self.head(self.object_name), "choices": [
            {"index": 0, "message": {"role": "assistant",
                                     "content": "".join(e.text for e in evs)},
             "logprobs": self._logprobs(evs), "finish_reason": self.finish_reason(fin)}],
            "usage": usage(self.prompt_n, fin.stats, self.completion_n(fin)),
            "timings": fin.stats.timings()}


async def completions(request: web.Request) -> web.StreamResponse:
    svc = ready(request)
    req = CompletionRequest.parse(await read_json(request), svc.vocab_size)
    svc.check_model(req.model)
    tokens, salt = await blocking(svc.completion_tokens, req.prompt, req.cache)
    params = svc.settle(tokens, req.max_tokens, req.params)
    gen = svc.generation(tokens, params, salt, req.cache.use_cache)
    fmt = CompletionFormat(svc, len(tokens), req.max_tokens == 0)
    return await answer(request, gen, fmt, req.stream, req.include_usage)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    svc = ready(request)
    req = ChatRequest.parse(await read_json(request), svc.vocab_size)
    svc.check_model(req.model)
    tokens, salt = await blocking(svc.chat_tokens, req.messages, req.cache)
    params = svc.settle(tokens, req.max_tokens, req.params)
    gen = svc.generation(tokens, params, salt, req.cache.use_cache)
    fmt = ChatFormat(svc, len(tokens), req.max_tokens == 0)
    return await answer(request, gen, fmt, req.stream, req.include_usage)


async def models(request: web.Request) -> web.Response:
    svc = service(request)
    entry = {"id": svc.model_id, "object": "model", "created": int(svc.started),
             "owned_by": "ckptd"}
    if svc.rt is not None:
        model = svc.rt.model
        cfg = model.config
        entry["meta"] = {"arch": cfg.arch, "n_vocab": cfg.vocab_size, "n_ctx": svc.max_context,
                         "n_layers": len(cfg.layer_types), "fingerprint": model.fingerprint}
    return json_response({"object": "list", "data": [entry]})

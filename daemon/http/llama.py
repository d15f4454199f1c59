"""llama.cpp-server-compatible endpoints: /completion (/completions), /infill, /tokenize,
/detokenize, /apply-template, /props."""

from __future__ import annotations

from aiohttp import web

from ckptd.daemon.generation import Result
from ckptd.daemon.http import logprobs
from ckptd.daemon.http.common import blocking, json_response, read_json, ready
from ckptd.daemon.http.errors import ApiError
from ckptd.daemon.http.pipeline import Jobs, Prepared, generate
from ckptd.daemon.http.report import generation_settings, llama_answer, llama_final
from ckptd.daemon.http.respond import prompt_progress
from ckptd.daemon.http.schemas import (
    ApiRequest,
    DetokenizeRequest,
    InfillRequest,
    TokenizeRequest,
    llama_completion,
    openai_chat,
)
from ckptd.daemon.request import Finished, Progress
from ckptd.daemon.service import Service
from ckptd.model.sampling.decoding import TokenEvent
from ckptd.model.sampling.sampler import SamplingParams


class LlamaFormat:
    done_marker = False          # llama.cpp ends its streams without `data: [DONE]`
    timings = None               # live stats, with timings_per_token (respond.run)

    def __init__(self, svc: Service, texts: list[str],
                 jobs: list[tuple[list[int], SamplingParams]], prefill_only: bool,
                 return_tokens: bool = False, response_fields: tuple[str, ...] = ()) -> None:
        self.svc, self.texts, self.jobs = svc, texts, jobs
        self.prefill_only = prefill_only
        self.return_tokens, self.response_fields = return_tokens, response_fields
        self.generated: list[list[int]] = [[] for _ in jobs]
        self.text = ["" for _ in jobs]

    def opening(self, i: int) -> dict | None:
        return None

    def progress(self, i: int, ev: Progress) -> dict:
        t = {"cache_n": ev.cache, "prompt_n": ev.processed - ev.cache,
             "prompt_ms": round(ev.time_ms, 3), "predicted_n": 0, "predicted_ms": 0.0}
        return {"index": i, "content": "", "tokens": [], "stop": False,
                "prompt_progress": prompt_progress(ev), "timings": t}

    def chunk(self, i: int, ev: TokenEvent) -> dict | None:
        if self.prefill_only:
            return None
        self.generated[i].append(ev.token)
        self.text[i] += ev.text
        out = {"index": i, "content": ev.text, "tokens": [ev.token], "stop": False,
               "id_slot": -1, "tokens_predicted": len(self.generated[i]),
               "tokens_evaluated": len(self.jobs[i][0])}
        probs = logprobs.llama(self.svc.tokenizer, ev)
        if probs is not None:
            out["completion_probabilities"] = probs
        if self.timings is not None:
            out["timings"] = self.timings[i].timings()
        return out

    def error(self, err: ApiError) -> dict:
        return err.body()

    def closing(self, i: int, fin: Finished) -> dict:
        return {**llama_final(self.svc, self.jobs[i], self.texts[i], self.generated[i],
                              self.text[i], fin, self.prefill_only), "index": i}

    def usage(self, fins: list[Finished]) -> dict | None:
        return None

    def _one(self, i: int, res: Result) -> dict:
        out = {**llama_answer(self.svc, self.jobs[i], self.texts[i], res, self.prefill_only,
                              self.return_tokens), "index": i}
        if self.response_fields:
            out = {f: _path(out, f) for f in self.response_fields}
        return out

    def body(self, results: list[Result]) -> dict | list:
        out = [self._one(i, r) for i, r in enumerate(results)]
        return out[0] if len(out) == 1 else out


def _path(obj: dict, path: str):
    """A response field named by its path ("generation_settings/n_predict")."""
    for part in path.split("/"):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _format(svc: Service, p: Prepared, jobs: Jobs) -> LlamaFormat:
    opts = p.req.options
    return LlamaFormat(svc, p.texts, jobs, p.req.gen.max_tokens == 0, opts.return_tokens,
                       opts.response_fields)


def _completion(body: object, svc: Service) -> ApiRequest:
    return llama_completion(body, svc.parse_llama)


def _infill(body: object, svc: Service) -> ApiRequest:
    if svc.tokenizer.fim is None:
        raise ApiError(400, "this model's vocabulary has no fill-in-the-middle tokens "
                            "(<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>): /infill needs "
                            "them", None, "infill_not_supported")
    return llama_completion(body, svc.parse_llama, InfillRequest.parse(body))


async def completion(request: web.Request) -> web.StreamResponse:
    return await generate(request, _completion, _format)


async def infill(request: web.Request) -> web.StreamResponse:
    """Fill in the middle: the model's FIM tokens around the code before and after the
    gap (and other files before it), then the prompt as the gap's start."""
    return await generate(request, _infill, _format)


async def tokenize(request: web.Request) -> web.Response:
    svc = ready(request)
    req = TokenizeRequest.parse(await read_json(request))
    ids = await blocking(svc.tokenizer.encode, req.content, req.add_special)
    if not req.with_pieces:
        return json_response({"tokens": ids})
    return json_response({"tokens": [{"id": i, "piece": svc.tokenizer.decode([i])}
                                     for i in ids]})


async def detokenize(request: web.Request) -> web.Response:
    svc = ready(request)
    req = DetokenizeRequest.parse(await read_json(request), svc.vocab_size)
    return json_response({"content": await blocking(svc.tokenizer.decode, req.tokens)})


async def apply_template(request: web.Request) -> web.Response:
    """The prompt text a chat request renders to, without generating."""
    svc = ready(request)
    req = openai_chat(await read_json(request), svc.parse_openai)
    svc.check_model(req.model)
    text = await blocking(svc.prompts.render_chat, req.chat, False)
    return json_response({"prompt": text})


async def props(request: web.Request) -> web.Response:
    """The server's settings, as llama-server's /props reports them."""
    svc = ready(request)
    p = SamplingParams(max_tokens=1, temperature=svc.parse_llama.defaults.temperature,
                       top_k=svc.parse_llama.defaults.top_k,
                       top_p=svc.parse_llama.defaults.top_p,
                       min_p=svc.parse_llama.defaults.min_p,
                       seed=svc.parse_llama.defaults.seed)
    settings = generation_settings(svc, p)
    settings["n_predict"] = svc.cfg.n_predict or svc.cfg.max_tokens or -1
    tok = svc.tokenizer
    return json_response({
        "default_generation_settings": {"id": 0, "n_ctx": svc.max_context, "params": settings,
                                        "is_processing": False},
        "total_slots": svc.cfg.parallel, "model_alias": svc.model_id,
        "model_path": str(svc.path), "chat_template": tok.chat_template or "",
        "bos_token": tok.bos_token or "", "eos_token": tok.eos_token or "",
        "modalities": {"vision": svc.vision, "audio": False},
        "build_info": svc.system_fingerprint, "is_sleeping": svc.sleeping})

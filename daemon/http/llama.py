"""llama.cpp-server-compatible endpoints: /completion (/completions), /infill, /tokenize,
/detokenize, /apply-template, /props."""

from __future__ import annotations

from aiohttp import web

from ckptd.daemon.generation import Result
from ckptd.daemon.http.common import blocking, json_response, read_json, ready
from ckptd.daemon.http.errors import ApiError
from ckptd.daemon.http.respond import prompt_progress, run
from ckptd.daemon.http.schemas import (
    ChatRequest,
    DetokenizeRequest,
    InfillRequest,
    LlamaCompletionRequest,
    TokenizeRequest,
)
from ckptd.daemon.prompt import Prompt
from ckptd.daemon.request import Finished, Progress
from ckptd.daemon.service import Service
from ckptd.model.sampling.decoding import TokenEvent
from ckptd.model.sampling.filters import DEFAULT as DEFAULT_SAMPLERS
from ckptd.model.sampling.sampler import SamplingParams


def generation_settings(svc: Service, p: SamplingParams, prefill_only: bool = False) -> dict:
    """The settings a generation ran with, as llama-server reports them (the effective
    seed, logit_bias with -inf as null; ignore_eos bans the end tokens as a bias)."""
    bias = dict(p.logit_bias)
    if p.ignore_eos:
        bias.update({t: float("-inf") for t in svc.tokenizer.eos_ids})
    return {"n_predict": 0 if prefill_only else p.max_tokens, "seed": p.seed,
            "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
            "repeat_penalty": p.repetition_penalty, "repeat_last_n": p.penalty_last_n,
            "presence_penalty": p.presence_penalty, "frequency_penalty": p.frequency_penalty,
            "stop": list(p.stop), "ignore_eos": p.ignore_eos, "n_probs": p.logprobs or 0,
            "post_sampling_probs": p.post_sampling_probs,
            "backend_sampling": p.backend_sampling,
            "grammar": p.grammar.constraint.source if p.grammar else "",
            "logit_bias": [{"token": t, "bias": None if b == float("-inf") else b}
                           for t, b in bias.items()],
            "typical_p": p.typical_p, "top_n_sigma": p.top_n_sigma, "min_keep": p.min_keep,
            "xtc_probability": p.xtc_probability, "xtc_threshold": p.xtc_threshold,
            "dynatemp_range": p.dynatemp_range, "dynatemp_exponent": p.dynatemp_exponent,
            "samplers": list(p.samplers or DEFAULT_SAMPLERS), "mirostat": p.mirostat,
            "mirostat_tau": p.mirostat_tau, "mirostat_eta": p.mirostat_eta, **_dry(p), **OFF,
            "n_ctx": svc.max_context, "model": svc.model_id}


# what ckptd leaves out (daemon/http/sampling.py refuses them on), at their off values
OFF = {"adaptive_target": -1.0, "adaptive_decay": 0.9}


def _dry(p: SamplingParams) -> dict:
    d = p.dry
    if d is None:
        return {"dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
                "dry_penalty_last_n": -1}
    return {"dry_multiplier": d.multiplier, "dry_base": d.base,
            "dry_allowed_length": d.allowed_length, "dry_penalty_last_n": d.penalty_last_n}


def stop_type(svc: Service, p: SamplingParams, generated: list[int], text: str,
              fin: Finished) -> tuple[str, str]:
    """llama-server's stop_type (limit, eos, word, none) and the stop string matched:
    the text held back from the answer starts with it."""
    if fin.reason == "length":
        return "limit", ""
    last = generated[-1] if generated else None
    if last in set(svc.tokenizer.eos_ids) | set(p.stop_token_ids) and not p.ignore_eos:
        return "eos", ""
    tail = svc.tokenizer.decode(generated, True)[len(text):]
    word = next((s for s in p.stop if s in tail), "")
    return ("word", word) if word else ("none", "")


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

    def _probs(self, ev: TokenEvent) -> list[dict] | None:
        s = ev.sampled
        if s.logprob is None and s.prob is None:
            return None

        def one(t: int, v: float, key: str) -> dict:
            piece = self.svc.tokenizer.decode([t])
            return {"id": t, "token": piece, key: v, "bytes": list(piece.encode())}
        if s.prob is not None:                    # post_sampling_probs
            return [{**one(s.token, s.prob, "prob"),
                     "top_probs": [one(t, p, "prob") for t, p in s.top]}]
        return [{**one(s.token, s.logprob, "logprob"),
                 "top_logprobs": [one(t, lp, "logprob") for t, lp in s.top]}]

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
        probs = self._probs(ev)
        if probs is not None:
            out["completion_probabilities"] = probs
        if self.timings is not None:
            out["timings"] = self.timings[i].timings()
        return out

    def error(self, err: ApiError) -> dict:
        return err.body()

    def _stop_type(self, i: int, fin: Finished) -> tuple[str, str]:
        return stop_type(self.svc, self.jobs[i][1], self.generated[i], self.text[i], fin)

    def closing(self, i: int, fin: Finished) -> dict:
        stop_type, word = self._stop_type(i, fin)
        tokens, p = self.jobs[i]
        n = 0 if self.prefill_only else len(self.generated[i])
        # the context ran out before n_predict did
        truncated = stop_type == "limit" and len(tokens) + n >= self.svc.max_context
        return {"index": i, "content": "", "tokens": [], "id_slot": -1, "stop": True,
                "model": self.svc.model_id, "tokens_predicted": n,
                "tokens_evaluated": len(tokens), "tokens_cached": fin.stats.cache_n,
                "prompt": self.texts[i], "truncated": truncated, "stop_type": stop_type,
                "stopping_word": word, "has_new_line": "\n" in self.text[i],
                "generation_settings": generation_settings(self.svc, p, self.prefill_only),
                "timings": fin.stats.timings()}

    def usage(self, fins: list[Finished]) -> dict | None:
        return None

    def _one(self, i: int, res: Result) -> dict:
        probs = []
        if not self.prefill_only:
            for ev in res.events:
                self.chunk(i, ev)
                probs += self._probs(ev) or []
        out = {**self.closing(i, res.finished), "content": self.text[i],
               "tokens": self.generated[i] if self.return_tokens else []}
        if probs:
            out["completion_probabilities"] = probs
        if self.response_fields:
            out = {f: _path(out, f) for f in self.response_fields}
        return out

    def body(self, results: list[Result]) -> dict | list:
        out = [self._one(i, r) for i, r in enumerate(results)]
        return out[0] if len(out) == 1 else out


def verbose(svc: Service, job: tuple[list[int], SamplingParams], res: Result,
            prefill_only: bool) -> dict:
    """llama-server's __verbose: the answer in /completion's form, with the prompt text
    the model read (special tokens written out)."""
    text = svc.tokenizer.decode(job[0])
    return LlamaFormat(svc, [text], [job], prefill_only, True)._one(0, res)


def _path(obj: dict, path: str):
    """A response field named by its path ("generation_settings/n_predict")."""
    for part in path.split("/"):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


async def _complete(request: web.Request, svc: Service, req: LlamaCompletionRequest,
                    prompts: list[Prompt], texts: list[str], salt) -> web.StreamResponse:
    return await run(request, svc, prompts, salt, req.gen,
                     lambda jobs: LlamaFormat(svc, texts, jobs, req.gen.max_tokens == 0,
                                              req.return_tokens, req.response_fields))


async def completion(request: web.Request) -> web.StreamResponse:
    svc = ready(request)
    req = LlamaCompletionRequest.parse(await read_json(request), svc.parse_llama)
    prompts, texts, salt = [], [], None
    for p in req.prompts:
        prompt = await blocking(svc.completion_prompt, p, req.gen.cache)
        prompts.append(prompt)
        salt = prompt.salt
        texts.append(p if isinstance(p, str) else
                     await blocking(svc.tokenizer.decode, prompt.tokens))
    return await _complete(request, svc, req, prompts, texts, salt)


async def infill(request: web.Request) -> web.StreamResponse:
    """Fill in the middle: the model's FIM tokens around the code before and after the
    gap (and other files before it), then the prompt as the gap's start."""
    svc = ready(request)
    data = await read_json(request)
    if svc.tokenizer.fim is None:
        raise ApiError(400, "this model's vocabulary has no fill-in-the-middle tokens "
                            "(<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>): /infill needs "
                            "them", None, "infill_not_supported")
    fill = InfillRequest.parse(data)
    req = LlamaCompletionRequest.parse(data, svc.parse_llama, prompt_required=False)
    gap = req.prompts[0]
    tokens = await blocking(svc.infill_tokens, fill, gap)
    return await _complete(request, svc, req, [Prompt(tokens, req.gen.cache.salt)],
                           [gap if isinstance(gap, str) else ""], req.gen.cache.salt)


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
    req = ChatRequest.parse(await read_json(request), svc.parse_openai)
    text = await blocking(svc.render_chat, req.chat)
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
    settings["n_predict"] = svc.cfg.max_tokens or -1
    tok = svc.tokenizer
    return json_response({
        "default_generation_settings": {"id": 0, "n_ctx": svc.max_context, "params": settings,
                                        "is_processing": False},
        "total_slots": svc.cfg.parallel, "model_alias": svc.model_id,
        "model_path": str(svc.path), "chat_template": tok.chat_template or "",
        "bos_token": tok.bos_token or "", "eos_token": tok.eos_token or "",
        "modalities": {"vision": svc.vision, "audio": False},
        "build_info": svc.system_fingerprint, "is_sleeping": svc.sleeping})

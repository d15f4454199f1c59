"""llama.cpp-server-compatible endpoints: /completion, /tokenize, /detokenize."""

from __future__ import annotations

from aiohttp import web

from ckptd.daemon.generation import Result
from ckptd.daemon.http.common import blocking, json_response, read_json, ready
from ckptd.daemon.http.respond import answer
from ckptd.daemon.http.schemas import DetokenizeRequest, LlamaCompletionRequest, TokenizeRequest
from ckptd.daemon.request import Finished
from ckptd.daemon.service import Service
from ckptd.model.sampling.decoding import TokenEvent
from ckptd.model.sampling.sampler import SamplingParams


def llama_timings(fin: Finished) -> dict:
    t = fin.stats.timings()
    computed = max(t["prompt_n"] - t["cache_n"], 0)
    t["prompt_per_token_ms"] = round(t["prompt_ms"] / computed, 3) if computed else None
    n = t["predicted_n"]
    t["predicted_per_token_ms"] = round(t["predicted_ms"] / n, 3) if n else None
    return t


class LlamaFormat:
    done_marker = False          # llama.cpp ends its streams without `data: [DONE]`

    def __init__(self, svc: Service, prompt: str | list[int], tokens: list[int],
                 params: SamplingParams, prefill_only: bool) -> None:
        self.svc, self.prompt, self.tokens, self.params = svc, prompt, tokens, params
        self.prefill_only = prefill_only
        self.generated: list[int] = []
        self.text = ""

    def _probs(self, ev: TokenEvent) -> list[dict] | None:
        s = ev.sampled
        if s.logprob is None:
            return None

        def one(t: int, lp: float) -> dict:
            piece = self.svc.tokenizer.decode([t])
            return {"id": t, "token": piece, "logprob": lp, "bytes": list(piece.encode())}
        return [{**one(s.token, s.logprob), "top_logprobs": [one(t, lp) for t, lp in s.top]}]

    def opening(self) -> dict | None:
        return None

    def chunk(self, ev: TokenEvent) -> dict | None:
        if self.prefill_only:
            return None
        self.generated.append(ev.token)
        self.text += ev.text
        out = {"index": 0, "content": ev.text, "tokens": [ev.token], "stop": False,
               "id_slot": 0, "tokens_predicted": len(self.generated),
               "tokens_evaluated": len(self.tokens)}
        probs = self._probs(ev)
        if probs is not None:
            out["completion_probabilities"] = probs
        return out

    def _stop_type(self, fin: Finished) -> tuple[str, str]:
        if fin.reason == "length":
            return "limit", ""
        last = self.generated[-1] if self.generated else None
        eos = set(self.svc.tokenizer.eos_ids) | set(self.params.stop_token_ids)
        if last in eos and not self.params.ignore_eos:
            return "eos", ""
        tail = self.svc.tokenizer.decode(self.generated, True)[len(self.text):]
        word = next((s for s in self.params.stop if s in tail), "")
        return ("word", word) if word else ("none", "")

    def closing(self, fin: Finished) -> dict:
        stop_type, word = self._stop_type(fin)
        prompt = self.prompt if isinstance(self.prompt, str) else \
            self.svc.tokenizer.decode(self.prompt)
        n = 0 if self.prefill_only else len(self.generated)
        p = self.params
        return {"index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True,
                "model": self.svc.model_id, "tokens_predicted": n,
                "tokens_evaluated": len(self.tokens), "tokens_cached": fin.stats.cache_n,
                "prompt": prompt, "truncated": False, "stop_type": stop_type,
                "stopping_word": word, "has_new_line": "\n" in self.text,
                "generation_settings": {"n_predict": 0 if self.prefill_only else p.max_tokens,
                                        "temperature": p.temperature, "top_k": p.top_k,
                                        "top_p": p.top_p, "min_p": p.min_p, "seed": p.seed,
                                        "stop": list(p.stop), "ignore_eos": p.ignore_eos,
                                        "n_probs": p.logprobs or 0},
                "timings": llama_timings(fin)}

    def usage(self, fin: Finished) -> dict | None:
        return None

    def body(self, res: Result) -> dict:
        probs = []
        if not self.prefill_only:
            for ev in res.events:
                self.chunk(ev)
                probs += self._probs(ev) or []
        out = {**self.closing(res.finished), "content": self.text, "tokens": self.generated}
        if probs:
            out["completion_probabilities"] = probs
        return out


async def completion(request: web.Request) -> web.StreamResponse:
    svc = ready(request)
    req = LlamaCompletionRequest.parse(await read_json(request), svc.vocab_size)
    tokens, salt = await blocking(svc.completion_tokens, req.prompt, req.cache)
    params = svc.settle(tokens, req.max_tokens, req.params, "n_predict")
    gen = svc.generation(tokens, params, salt, req.cache.use_cache)
    fmt = LlamaFormat(svc, req.prompt, tokens, params, req.max_tokens == 0)
    return await answer(request, gen, fmt, req.stream)


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

"""What a finished generation reports, whatever the API answering: why it stopped
(llama-server's stop_type, which every API's finish reason is read from), the settings
it ran with, and llama.cpp's whole /completion answer (also OpenAI's `__verbose`)."""

from __future__ import annotations

from ckptd.daemon.generation import Result
from ckptd.daemon.http import logprobs
from ckptd.daemon.request import Finished
from ckptd.daemon.service import Service
from ckptd.model.sampling.filters import DEFAULT as DEFAULT_SAMPLERS
from ckptd.model.sampling.sampler import SamplingParams

# what ckptd leaves out (daemon/http/sampling.py refuses them on), at their off values
OFF = {"adaptive_target": -1.0, "adaptive_decay": 0.9}


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


def llama_final(svc: Service, job: tuple[list[int], SamplingParams], prompt: str,
                generated: list[int], text: str, fin: Finished, prefill_only: bool) -> dict:
    """The end of a llama.cpp answer: its last stream chunk, or a whole answer's fields
    beside the content."""
    tokens, p = job
    kind, word = stop_type(svc, p, generated, text, fin)
    n = 0 if prefill_only else len(generated)
    # the context ran out before n_predict did
    truncated = kind == "limit" and len(tokens) + n >= svc.max_context
    return {"index": 0, "content": "", "tokens": [], "id_slot": -1, "stop": True,
            "model": svc.model_id, "tokens_predicted": n, "tokens_evaluated": len(tokens),
            "tokens_cached": fin.stats.cache_n, "prompt": prompt, "truncated": truncated,
            "stop_type": kind, "stopping_word": word, "has_new_line": "\n" in text,
            "generation_settings": generation_settings(svc, p, prefill_only),
            "timings": fin.stats.timings()}


def llama_answer(svc: Service, job: tuple[list[int], SamplingParams], prompt: str, res: Result,
                 prefill_only: bool, return_tokens: bool = False) -> dict:
    """llama.cpp's whole /completion answer of one generation; OpenAI's answers carry it
    as `__verbose` (with the prompt text the model read, special tokens written out)."""
    evs = [] if prefill_only else res.events
    generated = [e.token for e in evs]
    text = "".join(e.text for e in evs)
    out = {**llama_final(svc, job, prompt, generated, text, res.finished, prefill_only),
           "content": text, "tokens": generated if return_tokens else []}
    probs = [p for e in evs for p in logprobs.llama(svc.tokenizer, e) or []]
    if probs:
        out["completion_probabilities"] = probs
    return out


def verbose(svc: Service, job: tuple[list[int], SamplingParams], res: Result,
            prefill_only: bool) -> dict:
    return llama_answer(svc, job, svc.tokenizer.decode(job[0]), res, prefill_only, True)

"""Typed request bodies, parsed and validated from JSON; every error names its field.

JSON types are checked strictly (true is not an int, 1.5 is not an int), `null`
means "not given", and unknown fields are ignored as OpenAI-compatible servers do.
`params.max_tokens` of a generation request is settled by the handler once the
prompt length is known (`max_tokens` None: as many as the context allows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ckptd.daemon.http.errors import bad_request
from ckptd.daemon.http.fields import Fields, type_error
from ckptd.model.sampling.sampler import SamplingParams

MAX_LOGIT_BIAS = 1024
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class CacheOptions:
    salt: str | None = None          # tenant isolation: different salts share nothing
    use_cache: bool = True
    context: str | None = None       # a named context (POST /v1/contexts) to put first


def _cache_options(f: Fields, use_cache_field: str = "cache") -> CacheOptions:
    # "" is no salt: it keys like none, so it must not pass for a tenant of its own
    return CacheOptions(f.str("cache_salt", max_len=256) or None, f.bool(use_cache_field, True),
                        f.str("context", max_len=128))


def _sampling(f: Fields, temperature: float, top_k: int, top_p: float, min_p: float,
              logprobs: int | None, penalties: dict) -> SamplingParams:
    seed = f.int("seed")
    return SamplingParams(
        max_tokens=0, temperature=f.float("temperature", temperature, 0.0, 100.0),
        top_k=f.int("top_k", top_k, 0), top_p=_top_p(f.float("top_p", top_p, 0.0, 1.0)),
        min_p=f.float("min_p", min_p, 0.0, 1.0),
        seed=None if seed is None or seed < 0 else seed, stop=f.stop(),
        ignore_eos=f.bool("ignore_eos"), logprobs=logprobs, **penalties)


def _openai_penalties(f: Fields, vocab_size: int) -> dict:
    """OpenAI's presence/frequency penalties and logit_bias ({"token id": bias}), and
    vLLM's repetition_penalty; counted as OpenAI counts them (model/penalties.py)."""
    return {"presence_penalty": f.float("presence_penalty", 0.0, -2.0, 2.0),
            "frequency_penalty": f.float("frequency_penalty", 0.0, -2.0, 2.0),
            "repetition_penalty": _positive(f, "repetition_penalty", 1.0),
            "logit_bias": _logit_bias(f, vocab_size, allow_false=False)}


def _llama_penalties(f: Fields, vocab_size: int) -> dict:
    """llama.cpp's repeat_penalty, presence/frequency penalties over the last
    repeat_last_n tokens, and logit_bias ([[id, bias | false], ...] or {"id": bias})."""
    return {"presence_penalty": f.float("presence_penalty", 0.0, -100.0, 100.0),
            "frequency_penalty": f.float("frequency_penalty", 0.0, -100.0, 100.0),
            "repetition_penalty": _positive(f, "repeat_penalty", 1.0),
            "penalty_last_n": f.int("repeat_last_n", 64, -1),
            "logit_bias": _logit_bias(f, vocab_size, allow_false=True)}


def _positive(f: Fields, name: str, default: float) -> float:
    v = f.float(name, default, 0.0, 100.0)
    if v == 0.0:
        raise bad_request(f"{name} must be > 0", name)
    return v


def _logit_bias(f: Fields, vocab_size: int, allow_false: bool,
                name: str = "logit_bias") -> tuple[tuple[int, float], ...]:
    """(token, bias) pairs from {"id": bias} or, for llama.cpp, [[id, bias], ...], where a
    bias of false bans the token (-inf)."""
    v = f.data.get(name)
    if v is None:
        return ()
    if isinstance(v, dict):
        pairs = list(v.items())
    elif allow_false and isinstance(v, list) and all(
            isinstance(p, list) and len(p) == 2 for p in v):
        pairs = [tuple(p) for p in v]
    else:
        want = "an object of token id: bias" + (" or a list of [id, bias] pairs"
                                                  if allow_false else "")
        raise type_error(name, want, v)
    if len(pairs) > MAX_LOGIT_BIAS:
        raise bad_request(f"{name} holds at most {MAX_LOGIT_BIAS} tokens", name)
    out: dict[int, float] = {}
    for key, bias in pairs:
        token = _bias_token(key, name)
        if not 0 <= token < vocab_size:
            raise bad_request(f"{name}: token id {token} is outside the vocabulary "
                              f"(0..{vocab_size - 1})", name)
        if allow_false and bias is False:
            bias = float("-inf")
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                or not -100.0 <= bias <= 100.0:
            raise bad_request(f"{name}: the bias of token {token} must be a number in "
                              f"[-100, 100]{' or false' if allow_false else ''}, got {bias!r}",
                              name)
        out[token] = float(bias)
    return tuple(out.items())


def _bias_token(key: object, name: str) -> int:
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and re.fullmatch(r"-?[0-9]{1,12}", key):
        return int(key)
    raise bad_request(f"{name}: {key!r} is not a token id (token strings are not supported)",
                      name)


def _top_p(v: float) -> float:
    if v <= 0.0:
        raise bad_request("top_p must be in (0, 1]", "top_p")
    return v


def _common(f: Fields) -> None:
    if f.int("n", 1) != 1:
        raise bad_request("only n = 1 is supported", "n")
    if f.int("best_of", 1) != 1:
        raise bad_request("only best_of = 1 is supported", "best_of")
    if f.bool("echo"):
        raise bad_request("echo is not supported", "echo")


@dataclass(frozen=True)
class CompletionRequest:
    """POST /v1/completions."""

    model: str | None
    prompt: str | list[int]
    max_tokens: int | None
    params: SamplingParams
    cache: CacheOptions
    stream: bool = False
    include_usage: bool = False

    @classmethod
    def parse(cls, data: object, vocab_size: int) -> CompletionRequest:
        f = Fields(data)
        _common(f)
        return cls(f.str("model"), _prompt(f, vocab_size), f.int("max_tokens", 16, 0),
                   _sampling(f, 1.0, 0, 1.0, 0.0, f.int("logprobs", None, 0, 20),
                             _openai_penalties(f, vocab_size)),
                   _cache_options(f), f.bool("stream"), _include_usage(f))


@dataclass(frozen=True)
class ChatRequest:
    """POST /v1/chat/completions."""

    model: str | None
    messages: list[dict]
    max_tokens: int | None
    params: SamplingParams
    cache: CacheOptions
    stream: bool = False
    include_usage: bool = False

    @classmethod
    def parse(cls, data: object, vocab_size: int) -> ChatRequest:
        f = Fields(data)
        _common(f)
        max_tokens = f.int("max_completion_tokens", None, 0)
        if max_tokens is None:
            max_tokens = f.int("max_tokens", None, 0)
        top = f.int("top_logprobs", None, 0, 20)
        logprobs = (top or 0) if f.bool("logprobs") else None
        return cls(f.str("model"), parse_messages(f.data.get("messages")), max_tokens,
                   _sampling(f, 1.0, 0, 1.0, 0.0, logprobs, _openai_penalties(f, vocab_size)),
                   _cache_options(f),
                   f.bool("stream"), _include_usage(f))


@dataclass(frozen=True)
class LlamaCompletionRequest:
    """POST /completion (llama.cpp's server fields and defaults)."""

    prompt: str | list[int]
    max_tokens: int | None           # n_predict; -1 (or absent): as many as the context allows
    params: SamplingParams
    cache: CacheOptions
    stream: bool = False

    @classmethod
    def parse(cls, data: object, vocab_size: int) -> LlamaCompletionRequest:
        f = Fields(data)
        n_predict = f.int("n_predict", -1, -1)
        n_probs = f.int("n_probs", 0, 0, 20)
        return cls(_prompt(f, vocab_size), None if n_predict == -1 else n_predict,
                   _sampling(f, 0.8, 40, 0.95, 0.05, n_probs or None,
                             _llama_penalties(f, vocab_size)),
                   _cache_options(f, "cache_prompt"), f.bool("stream"))


def _include_usage(f: Fields) -> bool:
    opts = f.data.get("stream_options")
    return False if opts is None else Fields(opts, "stream_options").bool("include_usage")


def _prompt(f: Fields, vocab_size: int) -> str | list[int]:
    v = f.data.get("prompt")
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
        v = v[0]                           # a batch of one
    if isinstance(v, str):
        return v
    if isinstance(v, list) and v:
        return Fields({"prompt": v}).token_ids("prompt", vocab_size)
    if v is None:
        raise bad_request("prompt is required", "prompt", "missing_field")
    if isinstance(v, list) and not v:
        raise bad_request("prompt must not be empty", "prompt")
    raise bad_request("prompt must be a string or a list of token ids (one prompt per request)",
                      "prompt", "invalid_type")


def parse_messages(v: object, name: str = "messages") -> list[dict]:
    """[{role, content}] with content flattened to text (text parts of a list joined)."""
    if not isinstance(v, list):
        raise bad_request(f"{name} must be a list of messages", name,
                          "missing_field" if v is None else "invalid_type")
    if not v:
        raise bad_request(f"{name} must not be empty", name)
    out = []
    for i, m in enumerate(v):
        where = f"{name}[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object", where, "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
        out.append({"role": role, "content": _content(m.get("content"), f"{where}.content")})
    return out


def _content(c: object, where: str) -> str:
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for p in c:
            if not isinstance(p, dict) or p.get("type") != "text" or \
                    not isinstance(p.get("text"), str):
                raise bad_request(f"{where}: only text parts are supported", where)
            parts.append(p["text"])
        return "".join(parts)
    raise bad_request(f"{where} must be a string or a list of text parts", where, "invalid_type")


@dataclass(frozen=True)
class TokenizeRequest:
    content: str
    add_special: bool = False
    with_pieces: bool = False

    @classmethod
    def parse(cls, data: object) -> TokenizeRequest:
        f = Fields(data)
        return cls(f.str("content", required=True), f.bool("add_special"),
                   f.bool("with_pieces"))


@dataclass(frozen=True)
class DetokenizeRequest:
    tokens: list[int]

    @classmethod
    def parse(cls, data: object, vocab_size: int) -> DetokenizeRequest:
        return cls(Fields(data).token_ids("tokens", vocab_size))


@dataclass(frozen=True)
class ContextRequest:
    """POST /v1/contexts: a named prefix, from text or from chat messages."""

    name: str
    text: str | None
    messages: list[dict] | None
    pin: bool = True
    salt: str | None = None

    @classmethod
    def parse(cls, data: object) -> ContextRequest:
        f = Fields(data)
        name = f.str("name", required=True, max_len=128)
        if not name or not all(c.isalnum() or c in "-_." for c in name):
            raise bad_request("name must be letters, digits, '-', '_' or '.'", "name")
        text = f.str("text")
        messages = f.data.get("messages")
        if (text is None) == (messages is None):
            raise bad_request("give exactly one of text or messages", "text")
        if text is not None and not text:
            raise bad_request("text must not be empty", "text")
        return cls(name, text, None if messages is None else parse_messages(messages),
                   f.bool("pin", True), f.str("cache_salt", max_len=256) or None)


@dataclass(frozen=True)
class KeyRequest:
    """POST /cache/pin and /cache/unpin: one entry by its hex key."""

    key: str

    @classmethod
    def parse(cls, data: object) -> KeyRequest:
        return cls(Fields(data).str("key", required=True))


@dataclass(frozen=True)
class ClearRequest:
    include_pinned: bool = False

    @classmethod
    def parse(cls, data: object) -> ClearRequest:
        return cls(Fields(data).bool("include_pinned"))

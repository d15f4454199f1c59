"""Typed request bodies, parsed and validated from JSON; every error names its field.

JSON types are checked strictly (true is not an int, 1.5 is not an int), `null`
means "not given", and unknown fields are ignored as OpenAI-compatible servers do.
`params.max_tokens` of a generation request is settled once the prompt length is
known (`max_tokens` None: as many as the context allows). Every generation route's
adapter reads its body into one `ApiRequest` (OpenAI's and llama.cpp's here,
anthropic_request.py and responses_request.py for the others); pipeline.py runs it.
Sampling fields live in sampling.py, prompts in prompts.py, chat messages in messages.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptd.daemon.http import prompts
from ckptd.daemon.http.chat import ChatPrompt
from ckptd.daemon.http.errors import bad_request
from ckptd.daemon.http.fields import Fields, Names
from ckptd.daemon.http.lora import parse_scales
from ckptd.daemon.http.messages import openai_messages
from ckptd.daemon.http.sampling import ParseContext, constraint, sampling
from ckptd.model.sampling.grammar import Constraint
from ckptd.model.sampling.sampler import SamplingParams

MAX_N = 16


@dataclass(frozen=True)
class CacheOptions:
    salt: str | None = None          # tenant isolation: different salts share nothing
    use_cache: bool = True
    context: str | None = None       # a named context (POST /v1/contexts) to put first


def _cache_options(f: Fields) -> CacheOptions:
    # "" is no salt: it keys like none, so it must not pass for a tenant of its own
    return CacheOptions(f.str("cache_salt", max_len=256) or None, f.bool("cache", True),
                        f.str("context", max_len=128))


def _n(f: Fields) -> int:
    if f.int("best_of", 1) != 1:
        raise bad_request("only best_of = 1 is supported", f.key("best_of"))
    if f.bool("echo"):
        raise bad_request("echo is not supported", f.key("echo"))
    return f.int("n", 1, 1, MAX_N)


def _include_usage(f: Fields) -> bool:
    opts = f.get("stream_options")
    return False if opts is None else Fields(opts, f.key("stream_options")).bool("include_usage")


@dataclass(frozen=True)
class Generate:
    """What every generation request carries beside its prompt."""
    max_tokens: int | None
    params: SamplingParams
    cache: CacheOptions
    constraint: tuple[str, Constraint] | None = None     # (field, what it asks)
    stream: bool = False
    n: int = 1
    include_usage: bool = False
    return_progress: bool = False
    id_slot: int | None = None
    verbose: bool = False            # llama-server's __verbose: the prompt text and more
    timings_per_token: bool = False  # every streamed chunk carries the timings so far
    lora: dict[int, float] | None = None   # LoRA scales by adapter id; None: the global ones


def generate(f: Fields, ctx: ParseContext, max_tokens: int | None, logprobs: int | None,
             llama: bool, extra: tuple[str, Constraint] | None = None) -> Generate:
    """The generation fields of a request, whatever its API (`f` names them as the API
    does); `extra`: a constraint the API gives in a shape of its own."""
    slot = f.int("id_slot")
    return Generate(max_tokens, sampling(f, ctx, logprobs, llama), _cache_options(f),
                    constraint(f, extra), f.bool("stream"), _n(f), _include_usage(f),
                    f.bool("return_progress"), None if slot is None or slot < 0 else slot,
                    f.bool("verbose", ctx.verbose), f.bool("timings_per_token"),
                    parse_scales(f.get("lora"), ctx.n_lora))


@dataclass(frozen=True)
class ApiRequest:
    """A generation request as its route's adapter read it, once, whatever the API: a
    chat, or prompts (a batch), or the code around an /infill gap; the generation
    fields; the client's name of the prompt's field (for a prompt's errors); and what
    only the route's answers use (`options`)."""
    model: str | None
    gen: Generate
    chat: ChatPrompt | None = None
    prompts: tuple[prompts.Prompt, ...] = ()
    fill: InfillRequest | None = None
    prompt_param: str = "prompt"
    options: object = None


def openai_completion(data: object, ctx: ParseContext) -> ApiRequest:
    """POST /v1/completions."""
    f = Fields(data)
    max_tokens = f.int("max_tokens", None, 0)
    if max_tokens is None:                 # llama-server takes its own name here too
        max_tokens = f.int("n_predict", 16, -1)
        max_tokens = None if max_tokens == -1 else max_tokens
    return ApiRequest(f.str("model"), generate(f, ctx, max_tokens,
                                               f.int("logprobs", None, 0, 20), False),
                      prompts=tuple(prompts.prompts(f.get("prompt"), ctx.vocab_size)))


def openai_chat(data: object, ctx: ParseContext) -> ApiRequest:
    """POST /v1/chat/completions (and /chat/completions/input_tokens, /apply-template)."""
    f = Fields(data)
    max_tokens = f.int("max_completion_tokens", None, 0)
    if max_tokens is None:
        max_tokens = f.int("max_tokens", None, 0)
    top = f.int("top_logprobs", None, 0, 20)
    logprobs = (top or 0) if f.bool("logprobs") else None
    gen = generate(f, ctx, max_tokens, logprobs, False)
    return ApiRequest(f.str("model"), gen, ChatPrompt.parse(f), prompt_param="messages")


# /completion's fields by llama-server's names: `cache_prompt` for the cache switch;
# one completion per prompt (n, best_of and echo are OpenAI's)
LLAMA_NAMES = Names(renamed={"cache": "cache_prompt"}, dropped=frozenset({"n", "best_of",
                                                                           "echo"}))


@dataclass(frozen=True)
class LlamaOptions:
    return_tokens: bool = False
    response_fields: tuple[str, ...] = ()


def llama_completion(data: object, ctx: ParseContext, fill: InfillRequest | None = None
                     ) -> ApiRequest:
    """POST /completion, /completions, /infill (llama.cpp's server fields and defaults)."""
    f = Fields(data, names=LLAMA_NAMES)
    n_predict = f.int("n_predict", f.int("max_tokens", -1, -1), -1)
    n_probs = f.int("n_probs", 0, 0, 20)
    fields = f.get("response_fields")
    if fields is not None and (not isinstance(fields, list) or
                               not all(isinstance(x, str) for x in fields)):
        raise bad_request("response_fields must be a list of strings", "response_fields",
                          "invalid_type")
    raw = f.get("prompt")
    ps = prompts.prompts(raw, ctx.vocab_size) if fill is None or raw else [""]
    gen = generate(f, ctx, None if n_predict == -1 else n_predict, n_probs or None, True)
    return ApiRequest(f.str("model"), gen, prompts=tuple(ps[:1] if fill else ps), fill=fill,
                      options=LlamaOptions(f.bool("return_tokens"), tuple(fields or ())))


@dataclass(frozen=True)
class InfillRequest:
    """POST /infill: the code before and after the gap, and other files as context."""

    prefix: str
    suffix: str
    extra: list[tuple[str, str]]         # (filename, text)

    @classmethod
    def parse(cls, data: object) -> InfillRequest:
        f = Fields(data)
        extra = f.data.get("input_extra") or []
        if not isinstance(extra, list):
            raise bad_request("input_extra must be a list of {filename, text}", "input_extra",
                              "invalid_type")
        chunks = []
        for i, e in enumerate(extra):
            where = f"input_extra[{i}]"
            ef = Fields(e, where)
            text = ef.data.get("text")
            name = ef.data.get("filename", "")
            if not isinstance(text, str) or not isinstance(name, str):
                raise bad_request(f"{where} needs a string text (and a string filename, when "
                                  "given)", where, "invalid_type")
            chunks.append((name, text))
        return cls(f.str("input_prefix", required=True), f.str("input_suffix", required=True),
                   chunks)


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
        messages = f.get("messages")
        if (text is None) == (messages is None):
            raise bad_request("give exactly one of text or messages", "text")
        if text is not None and not text:
            raise bad_request("text must not be empty", "text")
        return cls(name, text, None if messages is None else openai_messages(messages),
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

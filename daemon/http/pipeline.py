"""The steps every generation route takes, written once:

    ready -> parse (the route's adapter: its body into an ApiRequest, once) -> check_model
    -> tokens -> reply spec (how the answer is read: tool calls, thinking)
    -> tool grammar (what tool_choice forces) -> run (answered in the route's format)

A route gives its adapter (body -> ApiRequest, errors naming the route's own fields)
and its answer format; the routes that only count a prompt's tokens stop after
`tokens`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from ckptd.daemon.http.common import blocking, read_json, ready
from ckptd.daemon.http.respond import ReplyFormat, run
from ckptd.daemon.http.schemas import ApiRequest
from ckptd.daemon.http.tools import reply_spec, with_tool_grammar
from ckptd.daemon.service import Service
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.text.tool_calls.reply import ReplySpec

Jobs = list[tuple[list[int], SamplingParams]]


@dataclass(frozen=True)
class Prepared:
    """A request with its prompts' tokens: one list per prompt (a chat has one)."""
    req: ApiRequest
    tokens: list[list[int]]
    texts: list[str]            # each prompt as text, as llama.cpp's answers report it
    salt: str | None
    spec: ReplySpec | None = None


Parse = Callable[[object, Service], ApiRequest]
MakeFormat = Callable[[Service, Prepared, Jobs], ReplyFormat]


def _tokens(svc: Service, req: ApiRequest) -> tuple[list[list[int]], list[str], str | None]:
    """Every prompt's tokens and text, and the cache salt (blocking: tokenizing)."""
    if req.chat is not None:
        tokens, salt = svc.chat_tokens(req.chat, req.gen.cache, req.prompt_param)
        return [tokens], [""], salt
    if req.fill is not None:
        gap = req.prompts[0]
        return [svc.infill_tokens(req.fill, gap)], [gap if isinstance(gap, str) else ""], \
            req.gen.cache.salt
    out, texts, salt = [], [], None
    for p in req.prompts:
        tokens, salt = svc.completion_tokens(p, req.gen.cache)
        out.append(tokens)
        texts.append(p if isinstance(p, str) else svc.tokenizer.decode(tokens))
    return out, texts, salt


async def prepare(request: web.Request, parse: Parse) -> tuple[Service, Prepared]:
    """ready -> parse -> check_model -> tokens."""
    svc = ready(request)
    req = parse(await read_json(request), svc)
    svc.check_model(req.model)
    tokens, texts, salt = await blocking(_tokens, svc, req)
    return svc, Prepared(req, tokens, texts, salt)


async def generate(request: web.Request, parse: Parse,
                   make_format: MakeFormat) -> web.StreamResponse:
    """The whole pipeline: the generations run and answered by `make_format`'s format."""
    svc, p = await prepare(request, parse)
    g = p.req.gen
    if p.req.chat is not None:
        spec = reply_spec(svc, p.req.chat, p.tokens[0])
        g = with_tool_grammar(p.req.chat, spec, g)
        p = Prepared(p.req, p.tokens, p.texts, p.salt, spec)
    return await run(request, svc, p.tokens, p.salt, g,
                     lambda jobs: make_format(svc, p, jobs), p.req.prompt_param)


async def count(request: web.Request, parse: Parse) -> int:
    """How many tokens the request's prompt is, without generating."""
    _, p = await prepare(request, parse)
    return len(p.tokens[0])

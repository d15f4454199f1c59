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
from dataclasses import dataclass, replace

from aiohttp import web

from ckptd.daemon.http.common import blocking, read_json, ready
from ckptd.daemon.http.respond import ReplyFormat, run
from ckptd.daemon.http.schemas import ApiRequest
from ckptd.daemon.http.tools import reply_spec, with_tool_grammar
from ckptd.daemon.prompt import Prompt
from ckptd.daemon.service import Service
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.text.tool_calls.reply import ReplySpec

Jobs = list[tuple[list[int], SamplingParams]]


@dataclass(frozen=True)
class Prepared:
    """A request with its prompts (daemon/prompt.py: tokens and where the next request
    will part): one per prompt (a chat has one)."""
    req: ApiRequest
    prompts: list[Prompt]
    texts: PromptTexts          # each prompt as text, as llama.cpp's answers report it
    salt: str | None
    spec: ReplySpec | None = None

    @property
    def tokens(self) -> list[list[int]]:
        return [p.tokens for p in self.prompts]


class PromptTexts:
    """Each prompt as text, decoded from its ids only when an answer reads it: llama.cpp's
    /completion reports it at the end; OpenAI's answers never do, and a 64K-token
    prompt's decode costs ~30 ms before its first token otherwise."""

    def __init__(self, svc: Service, given: list[str | None], prompts: list[Prompt]) -> None:
        self.svc, self.given, self.prompts = svc, given, prompts

    def __len__(self) -> int:
        return len(self.given)

    def __getitem__(self, i: int) -> str:
        if self.given[i] is None:
            self.given[i] = self.svc.tokenizer.decode(self.prompts[i].tokens)
        return self.given[i]


Parse = Callable[[object, Service], ApiRequest]
MakeFormat = Callable[[Service, Prepared, Jobs], ReplyFormat]


def _prompts(svc: Service, req: ApiRequest, anchors: bool
             ) -> tuple[list[Prompt], PromptTexts, str | None]:
    """Every prompt and its text, and the cache salt (blocking: tokenizing). anchors:
    where the next request will part (not needed to count tokens)."""
    cache = req.gen.cache
    if req.chat is not None:
        prompt = svc.prompts.chat_prompt(req.chat, cache, anchors, req.prompt_param)
        return [prompt], PromptTexts(svc, [""], [prompt]), prompt.salt
    if req.fill is not None:
        gap = req.prompts[0]
        prompt = Prompt(svc.prompts.infill_tokens(req.fill, gap), cache.salt)
        return [prompt], PromptTexts(svc, [gap if isinstance(gap, str) else ""], [prompt]), \
            cache.salt
    out, given, salt = [], [], None
    for p in req.prompts:
        prompt = svc.prompts.completion_prompt(p, cache)
        out.append(prompt)
        salt = prompt.salt
        given.append(p if isinstance(p, str) else None)
    return out, PromptTexts(svc, given, out), salt


async def prepare(request: web.Request, parse: Parse,
                  anchors: bool = True) -> tuple[Service, Prepared]:
    """ready -> parse -> check_model -> tokens."""
    svc = ready(request)
    req = parse(await read_json(request), svc)
    svc.check_model(req.model)
    prompts, texts, salt = await blocking(_prompts, svc, req, anchors)
    return svc, Prepared(req, prompts, texts, salt)


async def generate(request: web.Request, parse: Parse,
                   make_format: MakeFormat) -> web.StreamResponse:
    """The whole pipeline: the generations run and answered by `make_format`'s format."""
    svc, p = await prepare(request, parse)
    g = p.req.gen
    if p.req.chat is not None:
        spec = reply_spec(svc, p.req.chat, p.prompts[0].tokens)
        g = with_tool_grammar(p.req.chat, spec, g)
        p = replace(p, spec=spec)
    return await run(request, svc, p.prompts, p.salt, g,
                     lambda jobs: make_format(svc, p, jobs), p.req.prompt_param)


async def count(request: web.Request, parse: Parse) -> int:
    """How many tokens the request's prompt is, without generating."""
    _, p = await prepare(request, parse, anchors=False)
    return len(p.prompts[0].tokens)

"""The daemon as the HTTP side sees it: its state, the Runtime once loaded, named
contexts, metrics.

`load()` blocks (run it on a thread); until it ends, `state` is "loading" and the
handlers answer 503. Prompt building lives here so that every endpoint turns
text, chat messages and named contexts into tokens the same way.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from jinja2.exceptions import TemplateError

from ckptd.daemon.config import ServeConfig
from ckptd.daemon.contexts import Context, ContextRegistry
from ckptd.daemon.generation import Generation
from ckptd.daemon.history import TierHistory
from ckptd.daemon.http import media as media_parts
from ckptd.daemon.http.chat import ChatPrompt
from ckptd.daemon.http.errors import ApiError, bad_request, context_exceeded
from ckptd.daemon.http.media import Media
from ckptd.daemon.http.sampling import LLAMA, OPENAI, ParseContext
from ckptd.daemon.http.schemas import CacheOptions, Generate
from ckptd.daemon.metrics import Metrics
from ckptd.daemon.prompt import Prompt, anchors_at, chat_heads
from ckptd.daemon.runtime import Runtime
from ckptd.daemon.sleep import WakeFailed
from ckptd.daemon.vision import limits as vision_limits
from ckptd.model.default import default_model_path
from ckptd.model.sampling.dry import DEFAULT_BREAKERS, BreakerTable
from ckptd.model.sampling.grammar import GrammarError, Grammars
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.text import templates
from ckptd.model.text.tool_calls import generic
from ckptd.model.text.tool_calls.detect import ToolSyntax, detect
from ckptd.model.text.tool_calls.reasoning import uses_thinking

VERSION = "0.1.0"

LOADING, READY, FAILED, DRAINING = "loading", "ready", "failed", "draining"
# between the other files of an /infill request when the vocabulary has no file separator
_SNIPPET = "\n\n--- snippet ---\n\n"


def model_name(path: str | Path) -> str:
    p = Path(path)
    return p.stem if p.suffix == ".gguf" else p.name


class Service:
    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.state = LOADING
        self.error: str | None = None
        self.path = Path(cfg.model) if cfg.model else default_model_path()
        # llama-server's id of a model with several names: the first in sorted order
        self.aliases = cfg.aliases or [model_name(self.path)]
        self.model_id = self.aliases[0]
        self.grammars: Grammars | None = None
        self.parse_openai: ParseContext | None = None
        self.parse_llama: ParseContext | None = None
        self.rt: Runtime | None = None       # set once loaded
        self.contexts = ContextRegistry(Path(cfg.cache_dir) / "contexts.json")
        self.metrics = Metrics()
        self.history = TierHistory()        # the tiers over time, for the page at /
        self.started = time.time()
        self.inflight = 0
        self._ctx_tokens: dict[str, tuple[str, list[int]]] = {}   # name -> (source, tokens)
        self._syntax: ToolSyntax | None = None

    def load(self, start: bool = True) -> None:
        """Load the model (blocking: call it from a thread). start=False: the caller runs
        the engine's loop itself (`rt.engine.run()`)."""
        rt = Runtime.load(self.cfg, self.path)
        cfg = self.cfg
        if cfg.chat_template_file is not None:
            rt.tokenizer.chat_template = templates.resolve(
                Path(cfg.chat_template_file).read_text())
        elif cfg.chat_template is not None:
            rt.tokenizer.chat_template = templates.resolve(cfg.chat_template)
        self.grammars = Grammars(rt.tokenizer, rt.vocab_size)
        # every token's text, read once here (off the event loop) for DRY's breakers
        tok = rt.tokenizer
        breakers = BreakerTable([tok.decode([i]) for i in range(tok.vocab_size)], tok.encode)
        breakers(DEFAULT_BREAKERS)
        self.parse_openai = ParseContext(rt.vocab_size, OPENAI.with_server(cfg),
                                         tok.encode, cfg.verbose, breakers, len(rt.adapters))
        self.parse_llama = ParseContext(rt.vocab_size, LLAMA.with_server(cfg),
                                        tok.encode, cfg.verbose, breakers, len(rt.adapters))
        if rt.engine.sleep is not None and cfg.metrics:
            metrics, stats = self.metrics, rt.store.stats
            rt.engine.sleep.on_enter.append(
                lambda: metrics.enter_sleep(rt.engine, stats(), self.state))
            rt.engine.sleep.on_leave.append(metrics.leave_sleep)
        self.rt = rt
        if start:
            self.rt.engine.start()
        self.state = READY

    def close(self) -> None:
        """Cancel what still runs, then flush and close the store (blocking)."""
        if self.rt is not None:
            self.rt.close()

    @property
    def sleeping(self) -> bool:
        return self.rt is not None and self.rt.engine.sleeping

    async def wake(self) -> None:
        """Load the model if the daemon sleeps (--sleep-idle-seconds), and wait for it;
        503 when that fails. Any request that needs the model counts as a task."""
        sleep = self.rt.engine.sleep if self.rt is not None and self.state == READY else None
        if sleep is None:
            return
        sleep.touch()
        if not sleep.sleeping:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.rt.engine.wake)
        except WakeFailed as e:
            raise ApiError(503, f"the model failed to load after sleeping: {e}", None,
                           "load_failed") from None

    def unavailable(self) -> ApiError | None:
        """Why requests can't be served now, or None when they can."""
        if self.state == READY:
            return None
        if self.state == LOADING:
            return ApiError(503, "the model is loading", None, "loading", {"Retry-After": "2"})
        if self.state == DRAINING:
            return ApiError(503, "the server is shutting down", None, "shutting_down")
        return ApiError(503, f"the model failed to load: {self.error}", None, "load_failed")

    def require_ready(self) -> None:
        err = self.unavailable()
        if err is not None:
            raise err

    @property
    def system_fingerprint(self) -> str:
        """The build and the weights answering, as OpenAI's system_fingerprint ("b..."
        like llama-server's build tag)."""
        return f"b{VERSION}-{self.rt.fingerprint[:12]}"

    def check_model(self, name: str | None) -> None:
        """One model is served: any name reaches it (OpenAI client code sends a fixed
        one), unless --strict-model-name."""
        if self.cfg.strict_model_name and name is not None and name not in self.aliases:
            raise ApiError(404, f"model {name!r} is not served here (this server serves "
                                f"{self.model_id!r})", "model", "model_not_found")

    @property
    def vocab_size(self) -> int:
        return self.rt.vocab_size

    @property
    def tokenizer(self):
        return self.rt.tokenizer

    @property
    def vision(self) -> bool:
        """Whether the model takes images (a vision tower is loaded)."""
        return self.rt is not None and self.rt.runner.embedder is not None

    @property
    def max_context(self) -> int:
        return self.rt.max_context

    def context(self, name: str, salt: str | None = None, check_salt: bool = True,
                param: str = "context") -> Context:
        """A named context; one registered under another tenant's salt is answered as
        unknown, so a request can't use it or learn that it exists. `param`: the field
        that named it."""
        ctx = self.contexts.get(name)
        if ctx is None or (check_salt and not ctx.visible_to(salt)):
            raise ApiError(404, f"no context named {name!r}", param, "context_not_found")
        return ctx

    def render_chat(self, chat: ChatPrompt, generating: bool = True) -> str:
        """The prompt text. The template sees what llama-server gives it: bos_token,
        eos_token, enable_thinking (--reasoning, or the request's), today's date as
        `datetime` and `date_string`, the tools, and chat_template_kwargs. A last
        assistant message is an answer to continue: the rest rendered, then its text.
        generating: the answer will be read, so tools need a call syntax ckptd reads
        (/apply-template only renders, as llama-server's does)."""
        messages, add, tail = chat.messages, chat.add_generation_prompt, ""
        if chat.prefill is not None:
            add, tail = True, chat.prefill
        variables = self._variables(chat.tools, chat.enable_thinking)
        if any(m.get("tool_calls") for m in messages) and not self.tool_syntax().shows_tools:
            messages = _calls_written(messages)
        if chat.tools:
            syntax = self.tool_syntax()
            if generating and chat.tool_choice != "none" and syntax.fmt is None:
                raise bad_request("tools: this model's chat template writes tool calls in a "
                                  "syntax this server (ckptd) does not read (it writes "
                                  f"{syntax.sample!r}); send tool_choice none, or serve the "
                                  "model with a chat template whose calls ckptd reads "
                                  "(docs/COMPATIBILITY.md)", "tools", "not_supported")
            if not syntax.shows_tools and chat.tool_choice != "none":
                messages = _with_system(messages, generic.instructions(chat.tools))
            if syntax.string_arguments:
                messages = _string_arguments(messages)
        variables.update(chat.kwargs)
        try:
            return self.tokenizer.apply_chat_template(messages, add, **variables) + tail
        except TemplateError as e:
            raise bad_request(f"the chat template rejected the messages: {e}",
                              "messages") from None

    def _variables(self, tools: list[dict], thinking: bool | None) -> dict:
        now = datetime.now()
        out = {"enable_thinking": self.cfg.reasoning != "off" if thinking is None else thinking,
               "datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y"),
               # what llama.cpp gives templates that list tools as text (FireFunction's)
               "functions": json.dumps(tools, indent=2) if tools else ""}
        if tools:
            out["tools"] = tools
        return out

    def tool_syntax(self) -> ToolSyntax:
        """Read from the template once (it is fixed at start-up)."""
        if self._syntax is None:
            src = self.tokenizer.chat_template
            render = lambda msgs, tools: self.tokenizer.apply_chat_template(   # noqa: E731
                msgs, True, **self._variables(tools, None))
            self._syntax = replace(detect(render), thinking=uses_thinking(src))
        return self._syntax

    def context_tokens(self, ctx: Context) -> list[int]:
        """A context's tokens; the same ids every time, so the same cache keys."""
        source = ctx.text if ctx.text is not None else repr(ctx.messages)
        hit = self._ctx_tokens.get(ctx.name)
        if hit is not None and hit[0] == source:
            return hit[1]
        if ctx.text is not None:
            ids = self.tokenizer.encode(ctx.text)
        else:
            ids = self.tokenizer.encode(self.render_chat(ChatPrompt(ctx.messages,
                                                                    add_generation_prompt=False)))
        self._ctx_tokens[ctx.name] = (source, ids)
        return ids

    def prompt_tokens(self, prompt: str | list) -> list[int]:
        """A prompt's ids: text encoded, a list of ids with text pieces encoded in place."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        out: list[int] = []
        for x in prompt:
            out += self.tokenizer.encode(x) if isinstance(x, str) else [x]
        return out

    def infill_tokens(self, fill, gap: str | list) -> list[int]:
        """Fill-in-the-middle in llama-server's repo-level layout (arXiv 2409.12186):
        [repo]myproject, each other file as [file_sep]name + its text (a plain snippet
        separator without that token), [file_sep]filename, then
        [prefix]code before the gap + the prompt (the gap's start)[suffix]code after[middle].
        Unlike llama-server, the prefix and suffix are not cut to a batch's size: a prefill
        of any length runs in chunks."""
        tok = self.tokenizer
        pre, suf, mid = tok.fim
        sep, repo, enc = tok.file_sep, tok.fim_repo, tok.encode
        out: list[int] = []
        if repo is not None:
            out += [repo] + enc("myproject\n")
        for name, text in fill.extra:
            out += [sep] + enc((name or "tmp") + "\n") if sep is not None else enc(_SNIPPET)
            out += enc(text)
        if sep is not None:
            out += [sep] + enc("filename\n")
        gap_ids = self.prompt_tokens(gap) if gap else []
        return out + [pre] + enc(fill.prefix) + gap_ids + [suf] + enc(fill.suffix) + [mid]

    def completion_prompt(self, prompt: str | list, cache: CacheOptions) -> Prompt:
        """A named context's tokens (its end an anchor: daemon/prompt.py), then the
        prompt's own (with its images' placeholders, when it has any)."""
        media = getattr(prompt, "media", None)
        if cache.context is None:
            if media:
                return Prompt(self.media_tokens([], prompt, media, "prompt"), cache.salt)
            return Prompt(self.prompt_tokens(prompt), cache.salt)
        ctx = self.context(cache.context, cache.salt)
        head = self.context_tokens(ctx)
        ids = (self.media_tokens(head, prompt, media, "prompt") if media
               else head + self.prompt_tokens(prompt))
        return Prompt(ids, cache.salt or ctx.salt, (len(head),))

    def media_tokens(self, head: list[int], text: str, media: Media,
                     where: str) -> media_parts.Prompt:
        """`head`, then the ids of `text` with each image's placeholders where its marker
        is (blocking: images are read and decoded here)."""
        embedder = self.rt.runner.embedder
        room = self.rt.runner.max_batch_tokens - self.cfg.step_tokens
        images = media_parts.prepare_all(media, embedder, self.cfg.media_path,
                                          vision_limits(self.cfg), room)
        body = media_parts.tokenize(text, media.marker, images, self.tokenizer.encode,
                                    embedder, where)
        out = media_parts.Prompt(head + body)
        out.images = tuple(im.moved(im.start + len(head)) for im in body.images)
        return out

    def chat_tokens(self, chat: ChatPrompt, cache: CacheOptions,
                    param: str = "messages") -> tuple[list[int], str | None]:
        """(tokens, salt); `param`: the field that holds the messages (images' errors)."""
        p = self.chat_prompt(chat, cache, anchors=False, param=param)
        return p.tokens, p.salt

    def chat_prompt(self, chat: ChatPrompt, cache: CacheOptions, anchors: bool = True,
                    param: str = "messages") -> Prompt:
        """The chat's tokens, and (anchors) where the next chat request over the same
        start will part from it (daemon/prompt.py). A chat with images has the named
        context's end as its one anchor (its text's offsets are not its tokens'); the
        cache moves any anchor that falls inside an image to the image's start. `param`:
        the field that holds the messages (images' errors)."""
        if chat.media:
            if cache.context is not None:
                ctx = self.context(cache.context, cache.salt)
                head = self.context_tokens(ctx)
                return Prompt(self.media_tokens(head, self.render_chat(chat), chat.media,
                                                param),
                              cache.salt or ctx.salt, (len(head),), tails=False)
            return Prompt(self.media_tokens([], self.render_chat(chat), chat.media, param),
                          cache.salt, tails=False)
        if cache.context is None:
            text = self.render_chat(chat)
            if not anchors:
                return Prompt(self.tokenizer.encode(text), cache.salt, tails=False)
            ids, ends = self.tokenizer.encode_ends(text)
            heads = (self._render_or_none(h) for h in chat_heads(chat))
            chars = [len(h) for h in heads if h is not None and text.startswith(h)]
            return Prompt(ids, cache.salt, anchors_at(ends, chars, len(ids)), tails=False)
        ctx = self.context(cache.context, cache.salt)
        if ctx.messages is not None:
            # Render the whole conversation and keep what follows the context's own
            # rendering, so the suffix reads as the template would have it.
            head = self.render_chat(chat.with_messages(ctx.messages, False))
            full = self.render_chat(chat.with_messages(ctx.messages + chat.messages,
                                                       chat.add_generation_prompt, chat.prefill))
            suffix = full[len(head):] if full.startswith(head) else self.render_chat(chat)
        else:
            suffix = self.render_chat(chat)
        head = self.context_tokens(ctx)
        return Prompt(head + self.tokenizer.encode(suffix), cache.salt or ctx.salt,
                      (len(head),), tails=False)

    def _render_or_none(self, chat: ChatPrompt) -> str | None:
        """A rendering for an anchor: None where the template refuses these messages
        (one that wants a user message last), which only costs the anchor."""
        try:
            return self.render_chat(chat)
        except ApiError:
            return None

    def fit_to_context(self, tokens: list[int], max_tokens: int | None, params: SamplingParams,
               prompt_param: str = "prompt") -> SamplingParams:
        """Check the prompt against the context limit (or what the KV memory holds, when
        that is less) and fix max_tokens: at most what the server allows (--max-tokens)
        and the context leaves, as llama-server clamps it (the answer then ends with
        finish_reason "length"). A request for 0 tokens computes its prompt (and caches
        it) and returns no text: it runs one."""
        n, limit, what = len(tokens), self.max_context, "the context"
        if self.rt.kv_tokens < limit:
            limit, what = self.rt.kv_tokens, "the KV memory (--kv-budget)"
        if n == 0:
            raise bad_request("the prompt is empty", prompt_param)
        if n >= limit:
            raise context_exceeded(n, limit, prompt_param, what)
        cap = min(limit - n, self.cfg.max_tokens or limit)
        max_tokens = cap if max_tokens is None else min(max_tokens, cap)
        return replace(params, max_tokens=max(1, max_tokens))

    def constrain(self, params: SamplingParams, gen: Generate) -> SamplingParams:
        """Compile the request's grammar or schema (blocking: call on a thread); a bad one
        is a 400 naming its field, never a silently unconstrained answer."""
        if gen.constraint is None:
            return params
        name, c = gen.constraint
        try:
            return replace(params, grammar=self.grammars.compile(c))
        except GrammarError as e:
            raise bad_request(f"{name}: {e}", name, "invalid_grammar") from None

    def generation(self, tokens: list[int], params: SamplingParams, salt: str | None,
                   use_cache: bool, progress: bool = False, id_slot: int | None = None,
                   lora: dict[int, float] | None = None, prompt: Prompt | None = None
                   ) -> Generation:
        """Submit a generation (503 + Retry-After when the queue is full). lora: the
        request's adapter scales by id (None: the global ones). prompt: where its
        tokens came from, for the snapshots its structure asks for (daemon/prompt.py)."""
        self.require_ready()
        scales = self.rt.adapters.effective(lora)
        gen = Generation(self.rt.engine, tokens, params, self.rt.adapters.salt(salt, scales),
                         use_cache, self.cfg.request_timeout, on_close=self._closed,
                         progress=progress, id_slot=id_slot, lora=scales,
                         anchors=prompt.anchors if prompt else (),
                         tails=prompt.tails if prompt else True)
        gen.submit()
        self.inflight += 1
        return gen

    def generations(self, jobs: list[tuple[list[int], SamplingParams]], salt: str | None,
                    g: Generate, prompts: list[Prompt] | None = None) -> list[Generation]:
        """Submit every (tokens, params) of one request, or none (the ones submitted are
        cancelled when a later one is refused). Copies of one prompt share its blocks: the
        scheduler lets the later ones wait for the first's prefill and adopt its pages.
        prompts: each job's Prompt, when the tokens came from one."""
        out: list[Generation] = []
        try:
            for i, (tokens, params) in enumerate(jobs):
                out.append(self.generation(tokens, params, salt, g.cache.use_cache,
                                           g.return_progress, g.id_slot, g.lora,
                                           prompts[i] if prompts else None))
        except BaseException:
            for gen in out:
                gen.close()
            raise
        return out

    def _closed(self) -> None:
        self.inflight -= 1


def _with_system(messages: list[dict], text: str) -> list[dict]:
    """`text` at the end of the system message (one put first when there is none)."""
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        return [{**first, "content": f"{first['content']}\n\n{text}"}] + messages[1:]
    return [{"role": "system", "content": text}] + messages


def _string_arguments(messages: list[dict]) -> list[dict]:
    """The calls' arguments as JSON text, for templates that write them as they are."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [
                {**c, "function": {**c["function"], "arguments": json.dumps(
                    c["function"]["arguments"], ensure_ascii=False)}}
                for c in m["tool_calls"]]}
        out.append(m)
    return out


def _calls_written(messages: list[dict]) -> list[dict]:
    """An assistant's past calls as the generic format's text, in its content, for a
    template that renders no calls (the model sees what it wrote)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            text = generic.written(m["tool_calls"])
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = f"{m['content']}\n{text}" if m.get("content") else text
        out.append(m)
    return out

"""The daemon as the HTTP side sees it: its state, the Runtime once loaded, named
contexts, metrics.

`load()` blocks (run it on a thread); until it ends, `state` is "loading" and the
handlers answer 503. Prompt building lives here so that every endpoint turns
text, chat messages and named contexts into tokens the same way.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from jinja2.exceptions import TemplateError

from ckptd.daemon.config import ServeConfig
from ckptd.daemon.contexts import Context, ContextRegistry
from ckptd.daemon.generation import Generation
from ckptd.daemon.http.errors import ApiError, bad_request
from ckptd.daemon.http.schemas import CacheOptions
from ckptd.daemon.metrics import Metrics
from ckptd.daemon.runtime import Runtime
from ckptd.model.default import default_model_path
from ckptd.model.sampling.sampler import SamplingParams

LOADING, READY, FAILED, DRAINING = "loading", "ready", "failed", "draining"


def model_name(path: str | Path) -> str:
    p = Path(path)
    return p.stem if p.suffix == ".gguf" else p.name


class Service:
    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.state = LOADING
        self.error: str | None = None
        self.path = Path(cfg.model) if cfg.model else default_model_path()
        self.model_id = model_name(self.path)
        self.rt: Runtime | None = None       # set once loaded
        self.contexts = ContextRegistry(Path(cfg.cache_dir) / "contexts.json")
        self.metrics = Metrics()
        self.started = time.time()
        self.inflight = 0
        self._ctx_tokens: dict[str, tuple[str, list[int]]] = {}   # name -> (source, tokens)

    # ---- lifecycle (blocking: call from a thread) ------------------------------------
    def load(self, start: bool = True) -> None:
        """start=False: the caller runs the engine's loop itself (`rt.engine.run()`)."""
        self.rt = Runtime.load(self.cfg, self.path)
        if start:
            self.rt.engine.start()
        self.state = READY

    def close(self) -> None:
        """Cancel what still runs, then flush and close the store (blocking)."""
        if self.rt is not None:
            self.rt.close()

    # ---- checks ----------------------------------------------------------------------
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

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_id:
            raise ApiError(404, f"model {name!r} is not served here (this server serves "
                                f"{self.model_id!r})", "model", "model_not_found")

    @property
    def vocab_size(self) -> int:
        return self.rt.vocab_size

    @property
    def tokenizer(self):
        return self.rt.tokenizer

    @property
    def max_context(self) -> int:
        return self.rt.max_context

    # ---- prompts ---------------------------------------------------------------------
    def context(self, name: str, salt: str | None = None, check_salt: bool = True) -> Context:
        """A named context; one registered under another tenant's salt is answered as
        unknown, so a request can't use it or learn that it exists."""
        ctx = self.contexts.get(name)
        if ctx is None or (check_salt and not ctx.visible_to(salt)):
            raise ApiError(404, f"no context named {name!r}", "context", "context_not_found")
        return ctx

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt)
        except TemplateError as e:
            raise bad_request(f"the chat template rejected the messages: {e}",
                              "messages") from None

    def context_tokens(self, ctx: Context) -> list[int]:
        """A context's tokens; the same ids every time, so the same cache keys."""
        source = ctx.text if ctx.text is not None else repr(ctx.messages)
        hit = self._ctx_tokens.get(ctx.name)
        if hit is not None and hit[0] == source:
            return hit[1]
        if ctx.text is not None:
            ids = self.tokenizer.encode(ctx.text)
        else:
            ids = self.tokenizer.encode(self.render_chat(ctx.messages, False))
        self._ctx_tokens[ctx.name] = (source, ids)
        return ids

    def completion_tokens(self, prompt: str | list[int],
                          cache: CacheOptions) -> tuple[list[int], str | None]:
        """(tokens, salt): a named context's tokens, then the prompt's own."""
        ids = list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(prompt)
        if cache.context is None:
            return ids, cache.salt
        ctx = self.context(cache.context, cache.salt)
        return self.context_tokens(ctx) + ids, cache.salt or ctx.salt

    def chat_tokens(self, messages: list[dict],
                    cache: CacheOptions) -> tuple[list[int], str | None]:
        if cache.context is None:
            return self.tokenizer.encode(self.render_chat(messages)), cache.salt
        ctx = self.context(cache.context, cache.salt)
        if ctx.messages is not None:
            # Render the whole conversation and keep what follows the context's own
            # rendering, so the suffix reads as the template would have it.
            head = self.render_chat(ctx.messages, False)
            full = self.render_chat(ctx.messages + messages)
            suffix = full[len(head):] if full.startswith(head) else self.render_chat(messages)
        else:
            suffix = self.render_chat(messages)
        return self.context_tokens(ctx) + self.tokenizer.encode(suffix), cache.salt or ctx.salt

    def settle(self, tokens: list[int], max_tokens: int | None, params: SamplingParams,
               param: str = "max_tokens", prompt_param: str = "prompt") -> SamplingParams:
        """Check the prompt against the context limit (or what the KV memory holds, when
        that is less) and fix max_tokens. A request for 0 tokens computes its prompt (and
        caches it) and returns no text: it runs one."""
        n, limit, what = len(tokens), self.max_context, "context limit"
        if self.rt.kv_tokens < limit:
            limit, what = self.rt.kv_tokens, "KV memory (--kv-budget)"
        if n == 0:
            raise bad_request("the prompt is empty", prompt_param)
        if n >= limit:
            raise bad_request(f"the prompt is {n} tokens; this server's {what} holds {limit} "
                              "(prompt plus at least one generated token)", prompt_param,
                              "context_length_exceeded")
        cap = self.cfg.max_tokens
        if max_tokens is None:
            max_tokens = limit - n if cap is None else min(limit - n, cap)
        elif cap is not None and max_tokens > cap:
            raise bad_request(f"{param} = {max_tokens} is more than this server generates for "
                              f"one request ({cap}, --max-tokens)", param)
        elif n + max_tokens > limit:
            raise bad_request(f"{param} = {max_tokens} with a {n}-token prompt is beyond the "
                              f"{what} of {limit} tokens", param, "context_length_exceeded")
        return replace(params, max_tokens=max(1, max_tokens))

    def generation(self, tokens: list[int], params: SamplingParams, salt: str | None,
                   use_cache: bool) -> Generation:
        """Submit a generation (503 + Retry-After when the queue is full)."""
        self.require_ready()
        gen = Generation(self.rt.engine, tokens, params, salt, use_cache,
                         self.cfg.request_timeout, on_close=self._closed)
        gen.submit()
        self.inflight += 1
        return gen

    def _closed(self) -> None:
        self.inflight -= 1

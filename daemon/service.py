"""The daemon as the HTTP side sees it: its state, the Runtime once loaded, named
contexts, metrics.

`load()` blocks (run it on a thread); until it ends, `state` is "loading" and the
handlers answer 503. Once loaded, `prompts` builds every endpoint's prompt the same
way (daemon/prompt.py).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from ckptd.daemon.config import ServeConfig
from ckptd.daemon.contexts import Context, ContextRegistry
from ckptd.daemon.generation import Generation
from ckptd.daemon.history import TierHistory
from ckptd.daemon.http.errors import ApiError, bad_request, context_exceeded
from ckptd.daemon.http.sampling import LLAMA, OPENAI, ParseContext
from ckptd.daemon.http.schemas import Generate
from ckptd.daemon.metrics import Metrics
from ckptd.daemon.prompt import Prompt, PromptBuilder
from ckptd.daemon.runtime import Runtime
from ckptd.daemon.sleep import WakeFailed
from ckptd.model.default import default_model_path
from ckptd.model.sampling.dry import DEFAULT_BREAKERS, BreakerTable
from ckptd.model.sampling.grammar import GrammarError, Grammars
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.text import templates

VERSION = "0.1.0"

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
        # llama-server's id of a model with several names: the first in sorted order
        self.aliases = cfg.aliases or [model_name(self.path)]
        self.model_id = self.aliases[0]
        self.grammars: Grammars | None = None
        self.parse_openai: ParseContext | None = None
        self.parse_llama: ParseContext | None = None
        self.rt: Runtime | None = None       # set once loaded
        self.prompts: PromptBuilder | None = None   # set once loaded
        self.contexts = ContextRegistry(Path(cfg.cache_dir) / "contexts.json")
        self.metrics = Metrics()
        self.history = TierHistory()        # the tiers over time, for the page at /
        self.started = time.time()
        self.inflight = 0

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
        self.prompts = PromptBuilder(cfg, rt.tokenizer, rt.runner, self.context)
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

    def fit_to_context(self, tokens: list[int], max_tokens: int | None, params: SamplingParams,
               prompt_param: str = "prompt") -> SamplingParams:
        """Check the prompt against the context limit (or what the KV memory holds, when
        that is less) and fix max_tokens: the request's own, else --n-predict (as
        llama-server, where a request's limit wins over the server's default); at most
        what the server allows (--max-tokens) and the context leaves, which llama-server
        clamps too (the answer then ends with finish_reason "length"). A request for 0
        tokens computes its prompt (and caches it) and returns no text: it runs one."""
        n, limit, what = len(tokens), self.max_context, "the context"
        if self.rt.kv_tokens < limit:
            limit, what = self.rt.kv_tokens, "the KV memory (--kv-budget)"
        if n == 0:
            raise bad_request("the prompt is empty", prompt_param)
        if n >= limit:
            raise context_exceeded(n, limit, prompt_param, what)
        cap = min(limit - n, self.cfg.max_tokens or limit)
        if max_tokens is None:
            max_tokens = self.cfg.n_predict
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

"""One generation as seen from the event loop: submit, iterate events, cancel.

The engine's thread calls `emit`; each event is handed to this
request's asyncio queue with `call_soon_threadsafe`, so handlers never block the
loop and never touch the model. Leaving `events()` early (client gone, handler
cancelled) cancels the request, which frees its sequence's pages.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from ckptd.daemon.engine import Engine
from ckptd.daemon.http.errors import ApiError, error_for
from ckptd.daemon.request import (
    EngineError,
    Finished,
    Progress,
    QueueFull,
    Request,
    RequestTimeout,
)
from ckptd.model.sampling.decoding import TokenEvent
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.sequence import FinishReason

GRACE_S = 5.0


@dataclass
class Result:
    """A finished generation, gathered: what non-streaming responses report."""

    tokens: list[int] = field(default_factory=list)
    text: str = ""
    events: list[TokenEvent] = field(default_factory=list)
    finished: Finished | None = None


class Generation:
    def __init__(self, engine: Engine, tokens: list[int], params: SamplingParams,
                 salt: str | bytes | None, use_cache: bool, timeout_s: float | None,
                 on_close: Callable[[], None] | None = None, progress: bool = False,
                 id_slot: int | None = None, lora: tuple[float, ...] = ()) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.engine = engine
        # a prompt with images carries their spans (daemon/http/media.py: Prompt)
        self.req = Request(tokens, params, self._emit, salt=salt, use_cache=use_cache,
                           timeout_s=timeout_s, progress=progress, id_slot=id_slot, lora=lora,
                           images=getattr(tokens, "images", ()))
        self.finished: Finished | None = None
        self.created = time.time()
        self.on_close = on_close
        self.closed = False

    def _emit(self, ev: object) -> None:          # worker thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)
        except RuntimeError:                      # the loop is closed: nobody is listening
            pass

    def submit(self) -> None:
        try:
            self.engine.submit(self.req)
        except QueueFull as e:
            raise error_for(e) from None

    def cancel(self) -> None:
        if self.finished is None:
            self.engine.cancel(self.req)

    def close(self) -> None:
        """The handler is done with it: cancel if unfinished (client gone). Idempotent."""
        if not self.closed:
            self.closed = True
            self.cancel()
            if self.on_close is not None:
                self.on_close()

    async def events(self) -> AsyncIterator[TokenEvent | Progress]:
        """Token events (and Progress, when asked for) until the end; `self.finished` is
        set when this returns normally.
        The engine enforces the time limit; past it (and a grace period) the request
        is ended here too, so a client never waits on a request the worker lost."""
        limit = self.req.timeout_s
        deadline = None if limit is None else self.loop.time() + limit + GRACE_S
        try:
            while True:
                try:
                    wait = None if deadline is None else deadline - self.loop.time()
                    ev = await asyncio.wait_for(self.queue.get(), wait)
                except asyncio.TimeoutError:
                    ev = Finished(FinishReason.ERROR, self.req.stats, RequestTimeout(
                        f"no answer within the request's time limit ({self.req.timeout_s} s)"))
                if isinstance(ev, Finished):
                    self.finished = ev
                    return
                yield ev
        finally:
            self.cancel()

    async def collect(self) -> Result:
        out = Result()
        async for ev in self.events():
            if isinstance(ev, Progress):
                continue
            out.tokens.append(ev.token)
            out.text += ev.text
            out.events.append(ev)
        out.finished = self.finished
        return out


def failure(fin: Finished) -> ApiError | None:
    """A generation that did not end normally, as the HTTP error a client gets."""
    if fin.reason == FinishReason.CANCELLED:
        return ApiError(503, "the request was cancelled (the server is shutting down)", None,
                        "cancelled")
    if fin.reason != FinishReason.ERROR:
        return None
    return error_for(fin.error or EngineError("generation failed"))

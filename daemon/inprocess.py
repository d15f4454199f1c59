"""Driving the engine on the caller's thread, as `ckptd generate`, the tests and the
tools do (`ckptd serve` runs the loop instead: Engine.run)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ckptd.daemon.request import EngineError, Finished, Request
from ckptd.model.sampling.decoding import TokenEvent
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.sequence import FinishReason


class InProcess:
    """Engine's methods for stepping it here (Engine subclasses this)."""

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
                 arrivals: list[int] | None = None, salt: str | None = None,
                 use_cache: bool = True) -> list[list[TokenEvent]]:
        """Generate for several prompts, stepping on this thread. Prompt i joins at step
        arrivals[i] (default: all at once). Returns each prompt's events."""
        n = len(prompts)
        plist = [params] * n if isinstance(params, SamplingParams) else list(params)
        arrivals = [0] * n if arrivals is None else list(arrivals)
        if len(plist) != n or len(arrivals) != n:
            raise ValueError(f"{n} prompts need as many params and arrivals, got "
                             f"{len(plist)} and {len(arrivals)}")
        if any(a < 0 for a in arrivals):
            raise ValueError("arrivals must be >= 0")
        if any(not p for p in prompts):
            raise ValueError("prompt is empty")
        events: list[list[TokenEvent]] = [[] for _ in prompts]
        ended: list[Finished | None] = [None] * n
        order = sorted(range(n), key=lambda i: arrivals[i])
        running: set[int] = set()
        it = 0
        while order or running:
            while order and arrivals[order[0]] <= it:
                i = order.pop(0)
                if plist[i].max_tokens > 0:
                    self.submit(Request(list(prompts[i]), plist[i], _collect(events[i], ended, i),
                                        salt=salt, use_cache=use_cache))
                    running.add(i)
            if not running:
                it = arrivals[order[0]]
                continue
            self.step()
            running = {i for i in running if ended[i] is None}
            it += 1
        failed = [f for f in ended if f is not None and f.reason == FinishReason.ERROR]
        if failed:
            raise EngineError(failed[0].message)
        return events

    def stream(self, prompt: list[int], params: SamplingParams,
               on_prefill: Callable[[int, int], None] | None = None) -> Iterator[TokenEvent]:
        """One prompt's events as they are generated, stepping on this thread.
        on_prefill(done, total): after each step while the prompt is computed."""
        if not prompt:
            raise ValueError("prompt is empty")
        if params.max_tokens <= 0:
            return
        events: list[TokenEvent] = []
        ended: list[Finished | None] = [None]
        req = Request(list(prompt), params, _collect(events, ended, 0))
        self.submit(req)
        try:
            while ended[0] is None:
                self.step()
                if on_prefill is not None and not events:
                    live = next((x for x in self.scheduler.running if x.req is req), None)
                    if live is not None:
                        on_prefill(live.seq.num_computed, len(prompt))
                yield from events
                events.clear()
        finally:
            if ended[0] is None:
                req.cancelled = True
                self.step()
        if ended[0].reason == FinishReason.ERROR:
            raise EngineError(ended[0].message)


def _collect(events: list, ended: list, i: int) -> Callable[[object], None]:
    def emit(ev: object) -> None:
        if isinstance(ev, Finished):
            ended[i] = ev
        else:
            events.append(ev)
    return emit

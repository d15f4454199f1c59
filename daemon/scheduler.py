"""The queue, the running set, and who computes what in the next step.

Requests wait in a bounded queue (QueueFull beyond it). Each step the scheduler
admits waiting requests up to `max_running`, then splits the step's token budget:
one token for every decoding sequence, the rest shared by prompts being
prefilled, the fewest tokens to go first and each taking at most an even share,
so a short prompt that arrives during a long prefill finishes in its first steps
instead of waiting behind it. A waiting request whose prompt starts with blocks a
running prefill is computing stays queued until they exist, then adopts them:
N clients on one new document compute it once. Thread-safe: the HTTP side
submits and cancels while the engine's thread schedules.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from ckptd.cache.manager import CacheManager
from ckptd.cache.work import Work
from ckptd.daemon.request import Live, QueueFull, Request
from ckptd.model.sequence import Sequence


@dataclass
class Batch:
    """One step's sequences: work[i] is lives[i]'s part of it."""
    lives: list[Live] = field(default_factory=list)
    work: list[Work] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.work)


class Scheduler:
    def __init__(self, cache: CacheManager, max_running: int = 4, queue_size: int = 64,
                 step_tokens: int = 256) -> None:
        self.cache = cache
        self.max_running, self.queue_size, self.step_tokens = max_running, queue_size, step_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Live] = []
        self.cond = threading.Condition()
        self.stopping = False

    # ---- from any thread -------------------------------------------------------------
    def submit(self, req: Request) -> None:
        with self.cond:
            if self.stopping:
                raise QueueFull("server busy: shutting down")
            if len(self.waiting) >= self.queue_size:
                raise QueueFull(f"server busy: queue is full ({self.queue_size} waiting)")
            self.waiting.append(req)
            self.cond.notify_all()

    def cancel(self, req: Request) -> bool:
        """Mark a request cancelled. True when it was still queued: it left the queue
        now (its place must not stay taken, refusing others with 503, until a running
        one ends) and the caller reports it finished."""
        with self.cond:
            req.cancelled = True
            queued = any(r is req for r in self.waiting)
            if queued:
                self.waiting = deque(r for r in self.waiting if r is not req)
            self.cond.notify_all()
        return queued

    def stop(self) -> None:
        """Cancel what waits and runs; the engine finishes them in its next step."""
        with self.cond:
            self.stopping = True
            for r in self.waiting:
                r.cancelled = True
            for live in self.running:
                live.req.cancelled = True
            self.cond.notify_all()

    def reopen(self) -> None:
        """Take requests again after stop()."""
        with self.cond:
            self.stopping = False

    def snapshot(self) -> list[Live]:
        """The running sequences, copied under the lock (for other threads)."""
        with self.cond:
            return list(self.running)

    @property
    def load(self) -> dict:
        with self.cond:
            return {"waiting": len(self.waiting), "running": len(self.running)}

    # ---- the engine's thread ---------------------------------------------------------
    def schedule(self) -> Batch:
        """The next step: new requests admitted to the running set, each running one
        with the tokens it may compute."""
        batch = Batch()
        budget = self.step_tokens
        self._admit_waiting()
        for live in self.running:
            if live.t_decode:
                batch.lives.append(live)
                batch.work.append(Work(live.seq, 1))
                budget -= 1
        prefills = sorted((live for live in self.running if not live.t_decode),
                          key=lambda live: len(live.seq.tokens) - live.seq.num_computed)
        for i, live in enumerate(prefills):
            share = max(0, budget // (len(prefills) - i))
            new = live.dec is None
            batch.lives.append(live)
            batch.work.append(Work(live.seq, share, new=new,
                                   chain=live.req.chain if new else None))
            budget -= share
        return batch

    # `running` changes only on the engine's thread, under the lock so that snapshot()
    # reads it whole from others
    def requeue(self, live: Live) -> None:
        """A new sequence admission had no room for: back to the front of the queue."""
        with self.cond:
            self.running.remove(live)
            self.waiting.appendleft(live.req)

    def remove(self, live: Live) -> None:
        with self.cond:
            self.running.remove(live)

    def take_cancelled(self) -> list[Request]:
        """Queued requests cancelled by stop(), taken off the queue."""
        with self.cond:
            gone = [r for r in self.waiting if r.cancelled]
            self.waiting = deque(r for r in self.waiting if not r.cancelled)
        return gone

    def _admit_waiting(self) -> None:
        while len(self.running) < self.max_running:
            req = self._next_waiting()
            if req is None:
                return
            # the sequence's tokens grow as it generates: the request keeps its prompt
            live = Live(req, Sequence(list(req.tokens), req.salt, req.use_cache, lora=req.lora,
                                      images=req.images), self._free_slot(req))
            with self.cond:
                self.running.append(live)

    def _free_slot(self, req: Request) -> int:
        """The slot index the request asked for when it is free, else the lowest free."""
        taken = {live.slot for live in self.running}
        if req.id_slot is not None and req.id_slot not in taken \
                and req.id_slot < self.max_running:
            return req.id_slot
        return min(set(range(self.max_running + 1)) - taken)

    def _next_waiting(self) -> Request | None:
        """The oldest waiting request, taken off the queue, that is not waiting for a
        running prefill computing part of its prompt."""
        cache = self.cache
        prefills = [live for live in self.running
                    if not live.t_decode and live.req.chain is not None]
        with self.cond:
            queue = list(self.waiting)
        for req in queue:
            if req.cancelled:
                continue                       # take_cancelled() reports it
            if req.use_cache and cache.enabled:
                if req.chain is None:          # hashed once; admission and puts reuse it
                    req.chain = cache.chain(req.tokens, req.salt, req.images)
                if self._waits_for(req, prefills):
                    continue
            with self.cond:
                for i, queued in enumerate(self.waiting):
                    if queued is req:          # identity: two equal prompts are two requests
                        del self.waiting[i]
                        return req
        return None

    def _waits_for(self, req: Request, prefills: list[Live]) -> bool:
        """Whether a running prefill is computing tokens this prompt starts with. The
        request then waits, and the prefill is asked to leave a snapshot where the two
        part: admitted once it is there, the request computes only its own tokens (N
        clients sending one new document compute it once)."""
        waits = False
        for live in prefills:
            if live.req.salt != req.salt:
                continue
            p = self.cache.common_prefix(req.chain, req.tokens, live.req.chain,
                                         live.req.tokens)
            if p > live.seq.num_computed:
                self.cache.add_branch(live.seq, p)
                waits = True
        return waits

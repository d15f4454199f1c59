"""The queue, the running set, and who computes how many tokens in the next step.

Requests wait in a bounded queue (QueueFull beyond it). Each step the scheduler
admits waiting requests up to `max_running`, each restored from the longest cached
prefix of its prompt (cache.restore; one with no room yet waits in the queue), then
decides every running sequence's tokens for the step, once: one for every decoding
sequence (and a draft's, with speculative decoding), and for prompts being prefilled
an even share of the rest of the step's budget each, the fewest tokens to go first,
each ending at its next planned snapshot stop and never inside an image (cache.chunk:
an image is taken whole, one past its share a step). So a short prompt that
arrives during a long prefill finishes in its first steps instead of waiting behind
it. A waiting request whose prompt starts with blocks a running prefill is computing
stays queued until they exist, then adopts them: N clients on one new document
compute it once. Thread-safe: the HTTP side submits and cancels while the engine's
thread schedules.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from ckptd.cache.device import OutOfPages
from ckptd.cache.manager import CacheManager
from ckptd.cache.work import Draft, Failed, RestoreInfo, Work
from ckptd.daemon.request import Live, QueueFull, Request
from ckptd.model.sequence import Sequence
from ckptd.model.spec import OutOfCells


class Drafting(Protocol):
    """Speculative decoding's one hook in the loop (daemon/speculation.py)."""

    def propose(self, decoding: list[Live], cache: CacheManager) -> dict[int, Draft]:
        """Drafts for the decoding sequences (given every one, each step), by sequence
        id: appended to their tokens, with pages for them. Each rides on its Work and
        is verified as the work's outcome."""


@dataclass
class Batch:
    """One step: each running sequence and its work, decodes first, in the order the
    model computes them."""
    entries: list[tuple[Live, Work]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __iter__(self):
        return iter(self.entries)

    @property
    def work(self) -> list[Work]:
        return [w for _, w in self.entries]

    def runs(self) -> list[tuple[Sequence, int]]:
        """(sequence, tokens) of every work the model computes this step."""
        return [(w.seq, w.n) for _, w in self.entries if w.runs]

    def drafted(self) -> frozenset[int]:
        """Ids of the sequences whose every computed token's logits are wanted (a draft
        to verify)."""
        return frozenset(w.seq.id for _, w in self.entries if w.runs and w.drafted)


class Scheduler:
    """submit, cancel, stop, reopen, snapshot and load are called from any thread (the
    HTTP side); the rest only from the engine's, which alone changes `running` (under
    the lock, so that snapshot() reads it whole from others)."""

    def __init__(self, cache: CacheManager, max_running: int = 4, queue_size: int = 64,
                 step_tokens: int = 256, drafting: Drafting | None = None) -> None:
        """drafting: speculative decoding, the one place drafts enter a step: they count
        in a decoding sequence's tokens."""
        self.cache, self.drafting = cache, drafting
        self.max_running, self.queue_size, self.step_tokens = max_running, queue_size, step_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Live] = []
        self.cond = threading.Condition()
        self.stopping = False

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

    def schedule(self) -> Batch:
        """The next step: waiting requests admitted (restored), then each running
        sequence with the tokens it computes."""
        restored = self._admit_waiting()
        batch, budget = Batch(), self.step_tokens
        decoding = [live for live in self.running if live.t_decode]
        drafts = self.drafting.propose(decoding, self.cache) if self.drafting else {}
        for live in decoding:
            d = drafts.get(live.seq.id)
            n = 1 + len(d.tokens) if d is not None else 1
            batch.entries.append((live, Work(live.seq, n, draft=d)))
            budget -= 1
        prefills = sorted((live for live in self.running if not live.t_decode),
                          key=lambda live: len(live.seq.tokens) - live.seq.num_computed)
        over = False
        for i, live in enumerate(prefills):
            share = max(0, budget // (len(prefills) - i))
            budget -= share
            got = restored.get(live)
            if isinstance(got, Exception):
                work = Work(live.seq, 0, new=True, refused=Failed(got))
            else:
                n = self.cache.chunk(live.seq, share)
                if n > share:
                    # a whole image past its share: one a step (the runner has room for
                    # one beyond the step's budget); another waits for the next step
                    n, over = (0, over) if over else (n, True)
                work = Work(live.seq, n, new=got is not None, restored=got)
            batch.entries.append((live, work))
        return batch

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

    def _admit_waiting(self) -> dict[Live, RestoreInfo | Exception]:
        """Waiting requests into the running set while there is room, each a sequence
        restored from the longest cached prefix of its prompt: {live: what its restore
        gave, or the exception it failed with}. A request the cache has no room for
        goes back to the front of the queue."""
        out: dict[Live, RestoreInfo | Exception] = {}
        no_room = []
        for _ in range(self.max_running - len(self.running)):
            req = self._next_waiting()
            if req is None:
                break
            # the sequence's tokens grow as it generates: the request keeps its prompt
            seq = Sequence(list(req.tokens), req.salt, req.use_cache, lora=req.lora,
                           images=req.images)
            try:
                got = self.cache.restore(seq, req.chain, req.anchors, req.tails)
            except (OutOfPages, OutOfCells):
                no_room.append(req)
                continue
            except Exception as e:       # this request fails, the step goes on
                got = e
            live = Live(req, seq, self._free_slot(req), t_prefill=time.perf_counter())
            with self.cond:
                self.running.append(live)
            out[live] = got
        if no_room:
            with self.cond:
                self.waiting.extendleft(reversed(no_room))
        return out

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

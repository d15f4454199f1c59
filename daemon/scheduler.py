"""One worker thread owns the model: continuous batching with chunked prefill.

Each step runs every decoding sequence plus prefill chunks up to a token budget,
so a long prefill never stalls other clients' streams for more than one step.
Events go back to the event loop through each request's `emit` callback.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ckptd.daemon.engine import Engine, RestoreInfo
from ckptd.daemon.heap import Heap
from ckptd.model.generate import Decoding, TokenEvent
from ckptd.model.pages import OutOfPages
from ckptd.model.runner import Sequence
from ckptd.model.sampling.sampler import SamplingParams


class QueueFull(RuntimeError):
    pass


@dataclass
class Stats:
    prompt_n: int = 0
    cache_n: int = 0
    cache_tier: str | None = None
    restore_ms: float = 0.0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    queued_ms: float = 0.0

    def timings(self) -> dict:
        pp = self.prompt_n - self.cache_n
        return {
            "prompt_n": self.prompt_n, "cache_n": self.cache_n, "cache_tier": self.cache_tier,
            "restore_ms": round(self.restore_ms, 3), "prompt_ms": round(self.prompt_ms, 3),
            "prompt_per_second": round(pp / self.prompt_ms * 1000, 2) if self.prompt_ms else None,
            "predicted_n": self.predicted_n, "predicted_ms": round(self.predicted_ms, 3),
            "predicted_per_second": round(self.predicted_n / self.predicted_ms * 1000, 2)
            if self.predicted_ms else None,
            "queued_ms": round(self.queued_ms, 3),
        }


@dataclass
class Request:
    tokens: list[int]
    params: SamplingParams
    emit: Callable[[object], None]        # TokenEvent, then a final Finished; worker thread
    salt: str | None = None
    use_cache: bool = True
    timeout_s: float | None = None
    cancelled: bool = False
    keys: list[bytes] | None = None       # the prompt's block keys, once computed
    created: float = field(default_factory=time.perf_counter)
    stats: Stats = field(default_factory=Stats)


@dataclass
class Finished:
    reason: str                           # "stop", "length", "cancelled", "error"
    stats: Stats
    error: str | None = None


@dataclass
class _Live:
    req: Request
    seq: Sequence
    dec: Decoding
    t_prefill: float
    t_decode: float = 0.0


class Scheduler:
    def __init__(self, engine: Engine, tokenizer, max_running: int = 4, queue_size: int = 64,
                 step_tokens: int = 256) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.max_running, self.queue_size, self.step_tokens = max_running, queue_size, step_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[_Live] = []
        self.cond = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self.run, name="ckptd-scheduler", daemon=True)
        self.worker: threading.Thread | None = None      # the thread in run()
        self.done = threading.Event()                    # set when run() returns
        self.counters = {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0,
                         "generated_tokens": 0, "rejected": 0, "cancelled": 0, "errors": 0}
        self.cached_by_tier: dict[str, int] = {}         # restored tokens: device, host, disk
        self.observations: list[tuple[str, float]] = []   # (histogram, seconds), drained by metrics
        self.heap = Heap()                                # collects while idle (daemon/heap.py)

    def start(self) -> None:
        """Run the worker on a thread of its own."""
        self.worker = self.thread
        self.thread.start()

    def run(self) -> None:
        """Run the worker on the calling thread until stop(). The daemon calls this on the
        process's main thread: there libgomp lets torch's thread team spin between
        parallel regions. A team led by any other thread counts one thread more, and on
        a machine with no core to spare each of the ~600 regions of a step then sleeps
        and wakes (a 4K-context question: 130-150 ms instead of ~100)."""
        self.worker = threading.current_thread()
        try:
            self._loop()
        finally:
            self.done.set()

    def submit(self, req: Request) -> None:
        with self.cond:
            if self.stopping:
                raise QueueFull("shutting down")
            if len(self.waiting) >= self.queue_size:
                self.counters["rejected"] += 1
                raise QueueFull(f"queue is full ({self.queue_size} waiting)")
            self.waiting.append(req)
            self.counters["requests"] += 1
            self.cond.notify_all()

    def cancel(self, req: Request) -> None:
        with self.cond:
            req.cancelled = True
            # A waiting request leaves the queue now: its place must not stay taken (and
            # refuse others with 503) until a running one ends and the worker reaches it.
            queued = any(r is req for r in self.waiting)
            if queued:
                self.waiting = deque(r for r in self.waiting if r is not req)
                self.counters["cancelled"] += 1
            self.cond.notify_all()
        if queued:
            req.emit(Finished("cancelled", req.stats))

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel queued and running work, then wait for the worker to finish its step."""
        with self.cond:
            self.stopping = True
            for r in self.waiting:
                r.cancelled = True
            for live in self.running:
                live.req.cancelled = True
            self.cond.notify_all()
        if self.worker is not None and self.worker is not threading.current_thread():
            self.done.wait(timeout)

    @property
    def load(self) -> dict:
        with self.cond:
            return {"waiting": len(self.waiting), "running": len(self.running)}

    # ---- worker ------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self.cond:
                if self.stopping and not self.waiting and not self.running:
                    return
                idle = not self.waiting and not self.running
                if idle and not self.heap.due():
                    self.cond.wait(0.1)
                    continue
            if idle:
                self.heap.settle()            # outside the lock: submit() is not held up
                continue
            try:
                self._reap()
                self._admit()
                if self.running:
                    self._step()
            except Exception as e:  # keep serving: fail the running requests, not the daemon
                for live in list(self.running):
                    self._finish(live, "error", f"internal error: {type(e).__name__}: {e}")

    def _admit(self) -> None:
        while len(self.running) < self.max_running:
            req = self._next_waiting()
            if req is None:
                return
            if req.cancelled:
                req.emit(Finished("cancelled", req.stats))
                continue
            try:
                seq, info = self.engine.admit(req.tokens, req.salt, req.use_cache, req.keys)
            except OutOfPages:
                with self.cond:
                    self.waiting.appendleft(req)
                return
            except Exception as e:   # off the queue and not running: answer it here
                self.counters["errors"] += 1
                req.emit(Finished("error", req.stats, f"internal error: {type(e).__name__}: {e}"))
                continue
            self._start(req, seq, info)

    def _next_waiting(self) -> Request | None:
        """The oldest waiting request, taken off the queue, that is not waiting for a
        running prefill computing its prefix (it adopts those pages once they exist)."""
        shared = self.engine.shared
        prefills = [live.seq for live in self.running
                    if not live.t_decode and live.seq.use_cache] if shared else []
        with self.cond:
            queue = list(self.waiting)
        for req in queue:
            if prefills and req.use_cache and not req.cancelled:
                if req.keys is None:
                    req.keys = shared.keys(req.tokens, req.salt)
                if shared.computing(req.keys, prefills):
                    continue
            with self.cond:
                for i, queued in enumerate(self.waiting):
                    if queued is req:          # identity: two equal prompts are two requests
                        del self.waiting[i]
                        return req
        return None

    def _start(self, req: Request, seq: Sequence, info: RestoreInfo) -> None:
        st = req.stats
        st.prompt_n, st.cache_n, st.cache_tier = len(req.tokens), info.cached_tokens, info.tier
        st.restore_ms = info.restore_ms
        st.queued_ms = (time.perf_counter() - req.created) * 1000 - info.restore_ms
        self.counters["prompt_tokens"] += st.prompt_n
        self.counters["cached_tokens"] += st.cache_n
        if info.tier:
            for tier, n in info.tokens_by_tier().items():
                self.cached_by_tier[tier] = self.cached_by_tier.get(tier, 0) + n
            self.observations.append(("restore", info.restore_ms / 1000))
        live = _Live(req, seq, Decoding(self.tokenizer, req.params, req.tokens),
                     time.perf_counter())
        self.running.append(live)
        if info.logits is not None:          # exact repeat: the snapshot carried the logits
            self._prompt_done(live)
            self._sample(live, info.logits)

    def _reap(self) -> None:
        now = time.perf_counter()
        for live in list(self.running):
            r = live.req
            if r.cancelled:
                self._finish(live, "cancelled")
            elif r.timeout_s is not None and now - r.created > r.timeout_s:
                self._finish(live, "error", f"request exceeded its time limit ({r.timeout_s} s)")

    def _step(self) -> None:
        work, lives = [], []
        budget = self.step_tokens
        for live in self.running:
            if live.seq.num_computed >= len(live.seq.tokens) - 1 and live.t_decode:
                work.append((live.seq, 1))
                lives.append(live)
                budget -= 1
        # Prefills share what is left: the fewest tokens to go first, each taking at most
        # an even share, so a short prompt that arrives during a long prefill finishes
        # in its first steps instead of waiting behind it.
        prefills = sorted((live for live in self.running if not live.t_decode),
                          key=lambda live: len(live.seq.tokens) - live.seq.num_computed)
        for i, live in enumerate(prefills):
            if budget <= 0:
                break
            share = max(1, budget // (len(prefills) - i))
            n = self.engine.next_chunk(live.seq, share)
            work.append((live.seq, n))
            lives.append(live)
            budget -= n
        if not work:
            return
        try:
            logits = self.engine.runner.step(work)
        except OutOfPages:
            victim = self.running[-1]           # newest yields; others keep their pages
            self._finish(victim, "error", "out of KV cache memory: prompt too long for "
                                          "the remaining pages")
            return
        t = time.perf_counter()
        for row, live in enumerate(lives):
            seq = live.seq
            if live.t_decode:
                self._sample(live, logits[row])
            elif seq.num_computed < len(seq.tokens):
                self.engine.after_prefill_step(seq, None)
            else:
                self._prompt_done(live, t)
                # the first token goes out before the prompt is checkpointed (3-8 ms):
                # its client is waiting for it, the cache is not
                self._sample(live, logits[row], functools.partial(
                    self.engine.after_prefill_step, seq, logits[row]))

    def _prompt_done(self, live: _Live, t: float | None = None) -> None:
        t = t or time.perf_counter()
        st = live.req.stats
        st.prompt_ms = (t - live.t_prefill) * 1000
        computed = st.prompt_n - st.cache_n
        self.engine.rates.update_prefill(computed, st.prompt_ms / 1000)
        self.observations.append(("prefill", st.prompt_ms / 1000))
        live.t_decode = t

    def _sample(self, live: _Live, logits, after_emit: Callable[[], None] | None = None) -> None:
        ev: TokenEvent = live.dec.accept(logits)
        live.req.stats.predicted_n += 1
        self.counters["generated_tokens"] += 1
        live.req.emit(ev)
        if after_emit is not None:
            after_emit()
        if ev.finish_reason:
            self._finish(live, ev.finish_reason)
        else:
            live.seq.tokens.append(ev.token)

    def _finish(self, live: _Live, reason: str, error: str | None = None) -> None:
        st = live.req.stats
        if live.t_decode:
            st.predicted_ms = (time.perf_counter() - live.t_decode) * 1000
            self.observations.append(("decode", st.predicted_ms / 1000))
        if reason in ("stop", "length", "cancelled"):
            self.engine.checkpoint(live.seq, None)     # the next turn resumes after this answer
        if reason == "cancelled":
            self.counters["cancelled"] += 1
        if reason == "error":
            self.counters["errors"] += 1
        self.engine.runner.release(live.seq)
        self.running.remove(live)
        self.heap.worked()
        live.req.emit(Finished(reason, st, error))

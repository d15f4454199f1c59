"""The engine: one model, one loop, on one thread.

    batch = scheduler.schedule()          who computes how many tokens (daemon/scheduler.py)
    cache.admit(batch.work)               pages for them, or why not (cache/manager.py)
    logits = runner.run(batch.runs())     the model (model/runner.py)
    cache.after_step(batch.work, logits)  publish pages, capture checkpoints
    postprocess(batch, logits)            each work by its outcome: sample, stop, stream

Speculative decoding (daemon/speculation.py) enters that loop at one point, the
scheduler's Drafting hook: a decoding sequence's drafted tokens count in its work, and
the work carries its Draft through the step, so that its outcome is the draft verified
(Verified: the tokens kept, sampled in order, the rest taken back).

`ckptd serve` runs `run()` on the process's main thread (it says why) and the
HTTP side submits requests from its own; `ckptd generate` and the tests drive
`step()` directly through `generate()`. Events go back through each request's
`emit` callback.
"""

from __future__ import annotations

import logging
import threading
import time

import torch

from ckptd.cache.manager import CacheManager
from ckptd.cache.work import (
    Computed,
    Deferred,
    Failed,
    Idle,
    Repeated,
    RestoreInfo,
    Stalled,
    Verified,
)
from ckptd.daemon.gc_pacer import GcPacer
from ckptd.daemon.inprocess import InProcess
from ckptd.daemon.progress import PrefillLog
from ckptd.daemon.request import (
    EngineError,
    Finished,
    Live,
    Progress,
    QueueFull,
    Request,
    RequestTimeout,
)
from ckptd.daemon.scheduler import Batch, Scheduler
from ckptd.daemon.sleep import Sleep
from ckptd.daemon.slots import Slots
from ckptd.daemon.speculation import Speculation
from ckptd.model.runner import Runner
from ckptd.model.sampling import backend
from ckptd.model.sampling.decoding import Decoding, TokenEvent
from ckptd.model.sequence import FinishReason, check_token_ids
from ckptd.model.spec import StepLogits
from ckptd.model.vision.positions import check_spans

log = logging.getLogger("ckptd")


class Engine(InProcess):
    """submit, cancel, load, stop and wake are called from any thread; the loop (step,
    run) runs on one."""

    def __init__(self, runner: Runner, cache: CacheManager, tokenizer, max_running: int = 4,
                 queue_size: int = 64, step_tokens: int = 256,
                 check_invariants: bool = False, spec: Speculation | None = None) -> None:
        """spec: speculative decoding with a draft model (daemon/speculation.py)."""
        self.runner, self.cache, self.tokenizer = runner, cache, tokenizer
        self.spec = spec                 # for sleep: runtime.py unloads the draft model
        self.scheduler = Scheduler(cache, max_running, queue_size, step_tokens, drafting=spec)
        self.check_invariants = check_invariants
        self.broken: str | None = None      # a failed invariant check (check_invariants)
        self.counters = {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0,
                         "generated_tokens": 0, "rejected": 0, "cancelled": 0, "errors": 0,
                         # llama-server's figures (daemon/metrics.py: llamacpp:*)
                         "model_calls": 0, "busy_in_calls": 0, "prompt_ms": 0.0,
                         "predicted_ms": 0.0, "max_sequence_tokens": 0}
        self.cached_by_tier: dict[str, int] = {}        # restored tokens: device, host, disk
        self.observations: list[tuple[str, float]] = []  # (histogram, seconds), for metrics
        self.gc_pacer = GcPacer()                         # collects while idle
        self.progress = PrefillLog()                      # INFO lines for long prefills
        self.slots = Slots()            # the last sequence of each slot: what /slots saves
        self.sleep: Sleep | None = None   # --sleep-idle-seconds (daemon/sleep.py)
        self.worker: threading.Thread | None = None      # the thread in run()
        self.done = threading.Event()                    # set when run() returns

    def submit(self, req: Request) -> None:
        """Queue a request (on the caller's thread: the id check stays off the loop's)."""
        check_token_ids(req.tokens, self.runner.vocab_size)
        if req.images:
            self._check_images(req)
        if self.sleep is not None:
            self.sleep.touch()
        try:
            self.scheduler.submit(req)
        except QueueFull:                               # the caller answers 503
            self.counters["rejected"] += 1
            raise
        self.counters["requests"] += 1

    def _check_images(self, req: Request) -> None:
        """ValueError unless the model sees images and the spans are its placeholders."""
        embedder = self.runner.embedder
        if embedder is None:
            raise ValueError("this model has no vision encoder: it can't take images "
                             "(--mmproj)")
        check_spans(req.images, len(req.tokens), embedder.config.image_token_id, req.tokens)
        room = self.runner.max_batch_tokens - self.scheduler.step_tokens
        big = max(im.length for im in req.images)
        if big > room:       # a prefill chunk takes an image whole: it must fit a step
            raise ValueError(f"an image of {big} tokens is more than one step can take "
                             f"({room} beyond --step-tokens)")

    def cancel(self, req: Request) -> None:
        if self.scheduler.cancel(req):
            self.counters["cancelled"] += 1
            req.emit(Finished(FinishReason.CANCELLED, req.stats))

    @property
    def load(self) -> dict:
        return self.scheduler.load

    def step(self) -> bool:
        """One step of the loop; False when there was nothing to do."""
        self._reap()
        batch = self.scheduler.schedule()
        self.cache.admit(batch.work)
        logits = self.runner.run(batch.runs(), batch.drafted(), self._on_device_step(batch))
        self.cache.after_step(batch.work, logits)
        self._postprocess(batch, logits)
        self._stepped(batch, logits)
        return bool(batch)

    def _postprocess(self, batch: Batch, logits: StepLogits) -> None:
        """Each work by what became of it in the step: sample and emit, report a prompt's
        progress, finish, or back to the queue."""
        now = time.perf_counter()
        draws: list[tuple[Live, torch.Tensor]] = []      # sampled together, below
        for live, w in batch:
            outcome = w.outcome(logits)
            if isinstance(outcome, Deferred):
                self.scheduler.requeue(live)             # no room yet: it waits its turn
                continue
            if w.new:
                self._started(live, w.restored)
            match outcome:
                case Failed(error):
                    self._finish(live, FinishReason.ERROR, error)
                case Verified([*kept, last]):            # a draft's tokens and the next
                    for ev in kept:                      # in the sequence already
                        self._emit(live, ev, append=False)
                    self._emit(live, last)
                case Computed(rows) if live.t_decode:
                    draws.append((live, rows[-1]))
                case Computed(rows):                     # a chunk of its prompt
                    if live.req.progress:
                        self._progress(live, now)
                    if live.seq.num_computed == len(live.seq.tokens):
                        self._prompt_done(live, now)
                        draws.append((live, rows[-1]))
                case Repeated(last):                     # an exact repeat: nothing to compute
                    self._prompt_done(live, now)
                    draws.append((live, last))
                case Stalled() | Idle():
                    pass
        self._draw(draws)

    def _stepped(self, batch: Batch, logits: StepLogits) -> None:
        """What the step leaves to count: llama-server's model calls and busy sequences,
        long prefills' progress lines, the idle clock."""
        if logits:
            self.counters["model_calls"] += 1
            self.counters["busy_in_calls"] += len(logits.spans)
        self.progress.update(self.scheduler.running)
        if batch and self.sleep is not None:
            self.sleep.touch()        # idle from the step's end (a long step is no idle time)

    def _on_device_step(self, batch: Batch) -> bool:
        """Backend sampling wants the step's logits where the model ran: when a sequence
        computed in it asks for it."""
        return any(self._on_device(live) for live, w in batch if w.runs)

    def _on_device(self, live: Live) -> bool:
        """Backend sampling: asked for, and the request's chain runs there (backend.py)."""
        dec = live.dec
        if dec is None:              # not started yet: known once Decoding exists
            return live.req.params.backend_sampling
        return live.req.params.backend_sampling and backend.supports(dec.sampler)

    def _draw(self, draws: list[tuple[Live, torch.Tensor]]) -> None:
        """Sample each row: the backend's rows in one batch on the model's device, the
        others one by one on the host (llama.cpp falls back the same way)."""
        dev = [(live, x) for live, x in draws if self._on_device(live)]
        if dev:
            device = self.runner.device
            rows = torch.stack([x.to(device) for _, x in dev])
            for (live, _), s in zip(dev, backend.sample([live.dec.sampler for live, _ in dev],
                                                        rows)):
                self._emit(live, live.dec.take(s))
        for live, x in draws:
            if not self._on_device(live):
                self._emit(live, live.dec.accept(x.cpu()))

    def _started(self, live: Live, info: RestoreInfo | None) -> None:
        req, st = live.req, live.req.stats
        info = info or RestoreInfo()
        live.dec = Decoding(self.tokenizer, req.params, req.tokens)
        st.prompt_n, st.cache_n, st.cache_tier = len(req.tokens), info.cached_tokens, info.tier
        st.restore_ms, st.cache = info.restore_ms, info.report
        st.queued_ms = (live.t_prefill - req.created) * 1000 - info.restore_ms
        self.counters["prompt_tokens"] += st.prompt_n
        self.counters["cached_tokens"] += st.cache_n
        if req.progress:                          # the first report: what was restored
            req.emit(Progress(st.prompt_n, st.cache_n, st.cache_n, 0.0))
        if info.tier:
            for tier, n in info.tokens_by_tier().items():
                self.cached_by_tier[tier] = self.cached_by_tier.get(tier, 0) + n
            self.observations.append(("restore", info.restore_ms / 1000))

    def _progress(self, live: Live, now: float) -> None:
        st = live.req.stats
        done = min(live.seq.num_computed, st.prompt_n)
        live.req.emit(Progress(st.prompt_n, st.cache_n, done, (now - live.t_prefill) * 1000))

    def _prompt_done(self, live: Live, t: float) -> None:
        st = live.req.stats
        st.prompt_ms = (t - live.t_prefill) * 1000
        self.counters["prompt_ms"] += st.prompt_ms
        self.cache.rates.update_prefill(st.prompt_n - st.cache_n, st.prompt_ms / 1000)
        self.observations.append(("prefill", st.prompt_ms / 1000))
        live.t_decode = t

    def _emit(self, live: Live, ev: TokenEvent, append: bool = True) -> None:
        st = live.req.stats
        st.predicted_n += 1
        if live.t_decode:             # so far: what timings_per_token streams report
            st.predicted_ms = (time.perf_counter() - live.t_decode) * 1000
        self.counters["generated_tokens"] += 1
        live.req.emit(ev)
        if ev.finish_reason:
            self._finish(live, ev.finish_reason)
        elif append:
            live.seq.tokens.append(ev.token)

    def _reap(self) -> None:
        """End what was cancelled or ran out of time."""
        for req in self.scheduler.take_cancelled():
            self.counters["cancelled"] += 1
            req.emit(Finished(FinishReason.CANCELLED, req.stats))
        now = time.perf_counter()
        for live in list(self.scheduler.running):
            r = live.req
            if r.cancelled:
                self._finish(live, FinishReason.CANCELLED)
            elif r.timeout_s is not None and now - r.created > r.timeout_s:
                self._finish(live, FinishReason.ERROR, RequestTimeout(
                    f"request exceeded its time limit ({r.timeout_s} s)"))

    def _finish(self, live: Live, reason: FinishReason, error: Exception | None = None) -> None:
        st = live.req.stats
        if live.t_decode:
            st.predicted_ms = (time.perf_counter() - live.t_decode) * 1000
            self.counters["predicted_ms"] += st.predicted_ms
            self.observations.append(("decode", st.predicted_ms / 1000))
            if st.predicted_n > 1:       # the first token came with the prompt's last step
                self.cache.rates.update_step(st.predicted_ms / 1000 / (st.predicted_n - 1))
        self.counters["max_sequence_tokens"] = max(self.counters["max_sequence_tokens"],
                                                   len(live.seq.tokens))
        # the next turn resumes after this answer
        self.cache.finish(live.seq, checkpoint=reason != FinishReason.ERROR)
        if reason != FinishReason.ERROR and live.seq.num_computed:
            seq = live.seq
            n = seq.num_computed
            self.slots.remember(live.slot, seq.tokens[:n], seq.salt,
                                tuple(im for im in seq.images if im.end <= n))
        if reason == FinishReason.CANCELLED:
            self.counters["cancelled"] += 1
        elif reason == FinishReason.ERROR:
            self.counters["errors"] += 1
        self.scheduler.remove(live)
        self.gc_pacer.worked()
        live.req.emit(Finished(reason, st, error))

    def start(self) -> None:
        """Run the loop on a thread of its own (again, after a stop)."""
        self.scheduler.reopen()
        self.done.clear()
        self.worker = threading.Thread(target=self.run, name="ckptd-engine", daemon=True)
        self.worker.start()

    def run(self) -> None:
        """Run the loop on the calling thread until stop(). The daemon calls this on the
        process's main thread: there libgomp lets torch's thread team spin between
        parallel regions. A team led by any other thread counts one thread more, and on
        a machine with no core to spare each of the hundreds of regions of a step then
        sleeps and wakes (docs/BENCHMARKS.md, Measurements behind the code)."""
        self.worker = threading.current_thread()
        try:
            self._loop()
        finally:
            self.cache.store_pending()
            self._check()
            self.done.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel queued and running work, then wait for the loop to end its step."""
        self.scheduler.stop()
        if self.worker is not None and self.worker is not threading.current_thread():
            self.done.wait(timeout)

    def _loop(self) -> None:
        sched = self.scheduler
        worked = False              # work done since the loop last went idle
        while True:
            with sched.cond:
                idle = not sched.waiting and not sched.running
                if idle and sched.stopping:
                    return
                rest = idle and not worked and not self.gc_pacer.due()
                if rest and not (self.sleep is not None and self.sleep.due()):
                    sched.cond.wait(0.1)
                    continue
            if rest:                          # idle long enough: free the model
                self._sleep()
                continue
            if idle:                          # outside the lock: submit() is not held up
                self.cache.store_pending()     # checkpoints captured by the last steps
                if worked:
                    self._check()
                    worked = False
                if self.gc_pacer.due():
                    self.gc_pacer.collect()
                continue
            worked = True
            try:
                self.step()
            except Exception as e:  # keep serving: fail the running requests, not the daemon
                log.exception("engine step failed")
                for live in list(sched.running):
                    self._finish(live, FinishReason.ERROR,
                                 EngineError(f"internal error: {type(e).__name__}: {e}"))

    def _sleep(self) -> None:
        """Free the model until a request comes or a wake-up is asked for. The captured
        checkpoints are stored first and the device's prefix pages forgotten: the store
        holds what they held."""
        self.cache.store_pending()
        self.cache.device.evict_cached("the daemon went to sleep (model unloaded)")
        for req in self.sleep.doze(self.scheduler):      # the model did not load again
            self.counters["errors"] += 1
            req.emit(Finished(FinishReason.ERROR, req.stats, EngineError(
                f"the model failed to load after sleeping: {self.sleep.error}")))

    def wake(self, timeout: float | None = None) -> None:
        """(Any thread.) Load the model if it sleeps, and wait for it; WakeFailed."""
        if self.sleep is not None:
            def notify() -> None:
                with self.scheduler.cond:
                    self.scheduler.cond.notify_all()
            self.sleep.wake(notify, timeout)

    @property
    def sleeping(self) -> bool:
        return self.sleep is not None and self.sleep.sleeping

    def _check(self) -> None:
        """With check_invariants, the cache's invariants whenever the loop is idle."""
        if not self.check_invariants or self.broken:
            return
        try:
            self.cache.sanity_check()
        except AssertionError as e:
            self.broken = str(e) or "invariant broken"
            log.error("cache invariant broken: %s", self.broken)


def local_engine(model, tokenizer, num_pages: int, block_size: int = 16,
                 max_running: int = 1, graphs: bool | None = None) -> Engine:
    """An engine over device pages only (no store: nothing is cached), as `ckptd
    generate` runs it."""
    runner = Runner(model, num_pages, max_running, block_size, graphs=graphs)
    cache = CacheManager(runner, runner.spec, num_pages, model.fingerprint)
    return Engine(runner, cache, tokenizer, max_running=max_running)

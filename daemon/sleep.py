"""Sleeping (`--sleep-idle-seconds N`, llama-server's): after N seconds with no task the
daemon frees the model (weights, device pages, decode graphs) and the next request that
needs it loads it again. The host and disk cache tiers stay, so what was cached before
is restored after the wake-up, not computed again.

The engine's loop (its thread owns the model) enters and leaves the state; the HTTP
side asks for a wake-up and waits for it. As in llama-server, a /metrics scrape or a
/props, /health, /models or /slots read answers while asleep without waking it
(daemon/http/middleware.py: `wakes`) and does not count as a task.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("ckptd")


class WakeFailed(RuntimeError):
    """The model could not be loaded again; the daemon stays asleep and the next
    request tries again."""


class Sleep:
    """touch, due and wake are called from any thread; doze from the engine's."""

    def __init__(self, idle_s: float, unload: Callable[[], None],
                 reload: Callable[[], None]) -> None:
        if not idle_s > 0:
            raise ValueError(f"idle_s must be positive, got {idle_s}")
        self.idle_s = idle_s
        self._unload, self._reload = unload, reload
        self.on_enter: list[Callable[[], None]] = []   # before the model goes (snapshots)
        self.on_leave: list[Callable[[], None]] = []   # after it is back
        self.last = time.monotonic()         # the last task
        self.sleeping = False
        self.wanted = False                  # a wake-up was asked for
        self.error: str | None = None        # why the last wake-up failed
        self.awake = threading.Event()
        self.awake.set()
        self.cond = threading.Condition()
        self.count = 0                       # times it slept
        self.wake_s: float | None = None     # the last wake-up's load time

    def touch(self) -> None:
        """A task: the idle clock starts again."""
        self.last = time.monotonic()

    def due(self) -> bool:
        return not self.sleeping and time.monotonic() - self.last >= self.idle_s

    def wake(self, notify: Callable[[], None], timeout: float | None = None) -> None:
        """Ask for the model and wait until it is loaded (blocking: call on a thread).
        notify wakes the engine's loop. WakeFailed when the load failed."""
        self.touch()
        if not self.sleeping:
            return
        with self.cond:
            self.wanted = True
            self.error = None
        notify()
        self.awake.wait(timeout)
        with self.cond:
            if self.error is not None and self.sleeping:
                raise WakeFailed(self.error)

    def doze(self, sched) -> list:
        """Sleep until the scheduler has work, a wake-up is asked for, or it stops; then
        load the model again. Returns the requests that waited for a load that failed
        (taken out of the queue: the caller fails them), else []."""
        with sched.cond:
            if sched.waiting or sched.stopping:    # a request came meanwhile: stay up
                return []
        self.enter()
        while True:
            with sched.cond:
                while not (sched.waiting or sched.stopping or self.wanted):
                    sched.cond.wait(0.5)
                if sched.stopping:
                    return []                 # the loop ends; nothing needs the model
            if self.leave():
                return []
            with sched.cond:
                failed, sched.waiting = list(sched.waiting), type(sched.waiting)()
            if failed:
                return failed

    def enter(self) -> None:
        # asleep from here: a wake-up asked for while the model goes waits for it
        self.awake.clear()
        self.sleeping = True
        for f in self.on_enter:
            f()
        t0 = time.perf_counter()
        self._unload()
        _give_back_memory()
        self.count += 1
        log.info("sleeping after %.0f s idle: model freed in %.2f s (the cache tiers stay); "
                 "the next request loads it again", self.idle_s, time.perf_counter() - t0)

    def leave(self) -> bool:
        """Load the model again; False (the reason in `error`) when that failed."""
        t0 = time.perf_counter()
        try:
            self._reload()
        except Exception as e:  # a failed load must not end the loop: requests get errors
            with self.cond:
                self.error, self.wanted = f"{type(e).__name__}: {e}", False
            log.error("waking up failed, still asleep: %s", self.error)
            self.awake.set()                 # waiters read `error`
            self.awake.clear()
            return False
        self.wake_s = time.perf_counter() - t0
        with self.cond:
            self.sleeping, self.wanted, self.error = False, False, None
        self.touch()
        for f in self.on_leave:
            f()
        self.awake.set()
        log.info("awake: model loaded again in %.2f s", self.wake_s)
        return True


def _give_back_memory() -> None:
    """Collect the freed model's cycles and hand glibc's free pages back to the system,
    so that RSS drops (the point of sleeping)."""
    gc.unfreeze()                # daemon/gc_pacer.py froze the loaded model's objects
    gc.collect()
    gc.freeze()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):    # not glibc: the pages go back when reused
        pass

"""Thread pools whose threads are running before their first job.

A ThreadPoolExecutor starts a thread on a submit that finds none idle, and
`Thread.start` waits until the new thread has run: on a loaded machine that wait
was several milliseconds a thread, paid by the first restore after a start (its
reads, GETs and decodes each met a pool with no threads yet). Started here, when
the daemon opens its store, they cost nothing on a request's path.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

_START_TIMEOUT = 5.0     # seconds: a pool not started by then starts on its first jobs


def started_pool(threads: int, prefix: str) -> ThreadPoolExecutor:
    """A ThreadPoolExecutor of `threads` threads, all of them started (without
    waiting for them: they meet at a barrier, which holds each one's job until all
    have started, so that no job finds another thread idle and every submit starts
    one)."""
    pool = ThreadPoolExecutor(threads, thread_name_prefix=prefix)
    meet = threading.Barrier(threads)

    def wait() -> None:
        try:
            meet.wait(_START_TIMEOUT)
        except threading.BrokenBarrierError:
            pass                      # a busy machine: the rest start when used

    for _ in range(threads):
        pool.submit(wait)
    return pool

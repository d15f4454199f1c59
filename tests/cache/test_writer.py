"""The write-behind queue's threads run below the model's priority."""

from __future__ import annotations

import os
import threading

import pytest

from cache.writer import BACKGROUND_NICE, Writer


def _priority() -> tuple[int, int]:
    tid = threading.get_native_id()
    return os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)


def _background(priority: tuple[int, int]) -> bool:
    policy, nice = priority
    return policy == getattr(os, "SCHED_IDLE", None) or nice >= BACKGROUND_NICE


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="POSIX priorities")
def test_encode_and_commit_threads_run_in_the_background_and_the_caller_does_not():
    seen = {}

    def encode(item):
        seen["encode"] = _priority()
        return item

    def commit(items):
        seen["commit"] = _priority()
        return 0

    before = _priority()
    assert not _background(before)
    w = Writer(encode, commit, max_queue_bytes=1 << 20)
    try:
        assert w.put(b"x", 1)
        w.flush()
    finally:
        w.close()
    assert _background(seen["encode"]) and _background(seen["commit"]), seen
    assert _priority() == before           # only the writer's own threads

"""The write-behind queue's threads run below the model's priority."""

from __future__ import annotations

import os
import threading

import pytest

from cache.writer import BACKGROUND_NICE, Writer


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="POSIX priorities")
def test_encode_and_commit_threads_are_niced_and_the_caller_is_not():
    seen = {}

    def encode(item):
        seen["encode"] = _nice()
        return item

    def commit(items):
        seen["commit"] = _nice()
        return 0

    before = _nice()
    w = Writer(encode, commit, max_queue_bytes=1 << 20)
    try:
        assert w.put(b"x", 1)
        w.flush()
    finally:
        w.close()
    assert seen["encode"] >= BACKGROUND_NICE and seen["commit"] >= BACKGROUND_NICE, seen
    assert _nice() == before           # only the writer's own threads

"""serve.py's signal handling, apart from a running daemon."""

from __future__ import annotations

import asyncio

from ckptd.daemon.serve import _Http


def test_a_signal_after_the_loop_ended_is_ignored():
    # A second SIGTERM can land while the HTTP thread is closing its loop: the handler
    # then runs on the main thread against a closed loop, and must not raise there.
    http = _Http(cfg=None, svc=None)
    loop = asyncio.new_event_loop()
    http.loop, http.stop = loop, asyncio.Event()
    loop.close()
    http.request_stop()
    assert http.stop_requested

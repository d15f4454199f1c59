"""The tests' S3 server (tools/bench/seaweed.py) says at once, and why, when it cannot
store anything: a disk with less free space than its volumes need made every put hang
until its timeout, for each of a run's remote tests (CI once spent an hour so)."""

from __future__ import annotations

import shutil

import pytest

from tests.s3 import SeaweedS3


def test_a_server_that_cannot_write_fails_once_naming_the_free_space(tmp_path):
    if shutil.disk_usage(tmp_path).free > 1 << 50:
        pytest.skip("a disk with a PiB free")
    server = SeaweedS3(tmp_path, min_free="1PiB").start()     # more than any disk here
    try:
        with pytest.raises(TimeoutError, match=r"MiB free under .*(PutObject|\.ready)"):
            server.wait_ready(timeout=120, write_timeout=1)   # up, then one put
    finally:
        server.kill()

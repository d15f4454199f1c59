"""What daemons put on a shared remote (a real SeaweedFS, tests/s3.py): a context that
shares a prefix with one on the remote puts only its new segments, and a daemon killed
(SIGKILL) in the middle of an upload leaves no state naming a missing segment
(`ckptd inspect --remote verify`), and the next daemon still answers exactly."""

from __future__ import annotations

import json
import time

from ckptd.tools.bench.slow_proxy import SlowProxy
from ckptd.tools.cli import main
from tests.daemon.daemon_proc import Daemon
from tests.daemon.test_remote_daemons import ARGS, complete, env, start_all, stats, wait_uploaded
from tests.reliability.test_remote_faults import tokens
from tests.s3 import fresh_url

KV_BYTES = 256                      # the tiny hybrid's KV per token (fp32, one layer)


def test_a_shared_prefix_puts_only_the_new_segments(tiny_hybrid_dir, tmp_path, s3_server):
    url = fresh_url()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # 64 blocks a segment (1,024 tokens): the cells of a 9K context
    a, b = (Daemon(tiny_hybrid_dir, tmp_path / n / "cache", *ARGS, "--remote", url,
                   "--remote-segment-bytes", "256KiB", env=env(s3_server)) for n in "ab")
    start_all([a, b])
    try:
        first = tokens(30, 9000)
        second = first[:7000] + tokens(31, 2000)         # parts at 7,000 (in cell 6)
        complete(a, first)
        before = wait_uploaded(a)["remote"]["uploads"]
        want, _, _ = complete(a, second)
        up = wait_uploaded(a)["remote"]["uploads"]
        new = up["segment_bytes"] - before["segment_bytes"]
        # Cells 0-5 are the first context's; cell 6 from 6,144 and on is new.
        per_token = before["segment_bytes"] / 9000
        assert 0.95 * (9000 - 6144) < new / per_token < 1.05 * (9000 - 6144), new
        assert 0.8 * KV_BYTES < per_token <= 1.05 * KV_BYTES
        # Another daemon restores the second context from the remote, exactly.
        got, cached, tier = complete(b, second)
        assert got == want and tier == "remote" and cached >= 8192, (cached, tier)
    finally:
        for d in (a, b):
            assert d.stop() == 0, d.output()


def test_a_daemon_killed_mid_upload_leaves_no_dangling_state(tiny_hybrid_dir, tmp_path,
                                                             s3_server, capsys, monkeypatch):
    for k, v in s3_server.env().items():             # for `ckptd inspect` in this process
        monkeypatch.setenv(k, v)
    url = fresh_url()
    proxy = SlowProxy(s3_server.port, rate=150_000).start()     # 150 KB/s a connection
    for n in "ab":
        (tmp_path / n).mkdir()
    a = Daemon(tiny_hybrid_dir, tmp_path / "a" / "cache", *ARGS, "--remote", url,
               "--remote-segment-bytes", "256KiB",
               env={**env(s3_server), "AWS_ENDPOINT_URL": proxy.endpoint})
    b = Daemon(tiny_hybrid_dir, tmp_path / "b" / "cache", *ARGS, "--remote", url,
               env=env(s3_server))
    try:
        start_all([a, b])
        ctx = tokens(40, 9000)
        want, _, _ = complete(a, ctx)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:               # some segments up, more going
            up = stats(a)["remote"]["uploads"]
            if up["segments"] >= 2 and up["depth"]:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"no upload in progress to interrupt: {up}")
        a.proc.kill()                                    # SIGKILL, mid-upload
        a.proc.wait()
        capsys.readouterr()
        assert main(["inspect", "--remote", url, "verify", "--json"]) == 0
        checked = json.loads(capsys.readouterr().out)
        assert checked["dangling"] == [] and checked["bad"] == []
        assert checked["segments"] >= 2
        got, cached, tier = complete(b, ctx)              # whatever states made it up
        assert got == want, (cached, tier)
        assert complete(b, ctx + [7, 8, 9])[0] == complete(b, ctx + [7, 8, 9], cache=False)[0]
    finally:
        a.stop()
        assert b.stop() == 0, b.output()
        proxy.stop()

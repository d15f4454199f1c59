"""Several daemons, each with its own cache folder, sharing one S3 bucket (a real
SeaweedFS, tests/s3.py): a context one of them prefilled is restored by the others,
with the answer an uncached run gives, and never across salts."""

from __future__ import annotations

import random
import time

from ckptd.tools.cli import main
from tests.daemon.daemon_proc import Daemon
from tests.s3 import fresh_url

# At the default 16 tokens a block: the remote holds a context in segment objects of
# many blocks (8 MiB), read with a few ranged GETs, so a restore costs its bytes, not a
# request per block, and beats recomputing even the tiny model's fast prefill.
ARGS = ("--max-context", "10240", "--parallel", "2", "--snapshot-interval", "1024",
        "--request-timeout", "120", "--drain-timeout", "5")


def env(s3_server, **extra) -> dict:
    return {"OMP_NUM_THREADS": "1", **s3_server.env(), **extra}


def complete(d: Daemon, prompt: list[int], cache: bool = True, salt: str | None = None,
             n: int = 8) -> tuple[list[int], int, str | None]:
    """(greedy tokens, cached prompt tokens, the tier they came from)."""
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True,
            "cache_prompt": cache, "return_tokens": True}
    if salt is not None:
        body["cache_salt"] = salt
    r = d.post("/completion", body, timeout=180)
    assert r.status == 200, r.text
    return r.json["tokens"], r.json["tokens_cached"], r.json["timings"].get("cache_tier")


def stats(d: Daemon) -> dict:
    r = d.get("/cache/stats")
    assert r.status == 200, r.text
    return r.json


def wait_uploaded(d: Daemon, timeout: float = 60) -> dict:
    """Until what the daemon stored is on disk and on the remote."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = stats(d)
        if s["write_queue"]["depth"] == 0 and s["remote"]["uploads"]["depth"] == 0:
            return s
        time.sleep(0.05)
    raise TimeoutError("uploads did not drain")


def start_all(daemons: list[Daemon]) -> None:
    try:
        for d in daemons:
            d.wait_ready(120)
    except BaseException:
        for d in daemons:
            d.stop()
        raise


def test_a_context_prefilled_once_serves_every_daemon(tiny_hybrid_dir, tmp_path, s3_server,
                                                      capsys):
    url = fresh_url()
    rng = random.Random(22)
    context = [rng.randrange(3, 500) for _ in range(9000)]
    # Three daemons, three empty cache folders, one bucket; loading side by side.
    for name in "abc":
        (tmp_path / name).mkdir()
    a, b, c = (Daemon(tiny_hybrid_dir, tmp_path / name / "cache", *ARGS, "--remote", url,
                      env=env(s3_server)) for name in "abc")
    start_all([a, b, c])
    try:
        want, cached, _ = complete(a, context)
        assert cached == 0
        up = wait_uploaded(a)["remote"]["uploads"]
        assert up["segments"] >= 1 and up["states"] >= 1
        assert up["failed"] == up["dropped"] == up["evicted"] == 0

        for d in (b, c):
            got, cached, tier = complete(d, context)
            assert got == want
            assert cached >= 0.95 * len(context) and tier == "remote", (cached, tier)
            s = stats(d)
            assert s["scheduler"]["cached_tokens_by_tier"]["remote"] == cached
            assert s["remote"]["fetch"]["corrupt"] == s["remote"]["fetch"]["missing"] == 0
            # ~560 blocks in a few ranged GETs of a segment or two (was a GET a block)
            assert s["remote"]["fetch"]["requests"] <= 8
        assert complete(b, context, cache=False)[0] == want     # uncached, on B itself
        again, cached, tier = complete(b, context)              # now B's own: local
        assert again == want and cached >= 0.95 * len(context) and tier != "remote"
        metrics = b.get("/metrics").text
        assert 'ckptd_cache_hit_tokens_total{tier="remote"}' in metrics
        assert 'ckptd_remote_fetched_objects_total' in metrics
        capsys.readouterr()
        assert main(["inspect", "--url", b.url, "stats"]) == 0
        assert f"remote {url}" in capsys.readouterr().out

        # Another tenant's salt: nothing of A's context, from the remote or B's disk.
        got, cached, tier = complete(b, context, salt="tenant-other")
        assert cached == 0 and tier is None and got == want
        assert stats(b)["remote"]["fetch"]["objects"] == stats(c)["remote"]["fetch"]["objects"]
    finally:
        for d in (a, b, c):
            assert d.stop() == 0, d.output()

"""The remote tier's faults, against a real S3 server (SeaweedFS, tests/s3.py) and real
daemons: a remote killed mid-run, a corrupt object, refused keys and a remote that
crawls or hangs all cost a recompute (or a shorter restore), never a wrong answer,
a 5xx or a stall."""

from __future__ import annotations

import random
import threading
import time

from ckptd.tools.bench.slow_proxy import SlowProxy
from ckptd.tools.cli import main
from tests.daemon.daemon_proc import Daemon
from tests.daemon.test_remote_daemons import ARGS, complete, start_all, stats, wait_uploaded
from tests.remote_damage import flip_block
from tests.s3 import BUCKET, SeaweedS3, fresh_url

B = 16                                     # ARGS' block size (the default)


def spawn(tmp_path, name: str, model, url: str, env: dict) -> Daemon:
    (tmp_path / name).mkdir()
    return Daemon(model, tmp_path / name / "cache", *ARGS, "--remote", url,
                  env={"OMP_NUM_THREADS": "1", **env})


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


def metric(d: Daemon, prefix: str) -> float:
    lines = [ln for ln in d.get("/metrics").text.splitlines() if ln.startswith(prefix)]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


def test_a_remote_killed_mid_run_costs_recomputes_not_errors(tiny_hybrid_dir, tmp_path):
    server = SeaweedS3(tmp_path / "s3").start()
    url = fresh_url()
    try:
        a, b = (spawn(tmp_path, n, tiny_hybrid_dir, url, server.env()) for n in "ab")
        server.wait_ready()
        start_all([a, b])
    except BaseException:
        server.kill()
        raise
    try:
        ctx = tokens(1, 3000)
        want_ctx, cached, _ = complete(a, ctx)
        assert cached == 0
        wait_uploaded(a)
        got, cached, tier = complete(b, ctx)
        assert got == want_ctx and cached >= 0.95 * len(ctx) and tier == "remote"
        only_a = tokens(2, 700)                  # A computes it, B never did
        complete(a, only_a)
        wait_uploaded(a)

        prompts = {d: [ctx + tokens(10 + i, 60) for i in range(3)] +
                   [tokens(20 + i + 10 * (d is b), 500) for i in range(3)] for d in (a, b)}
        results: dict = {a: [], b: []}

        def run(d: Daemon) -> None:
            for p in prompts[d]:
                body = {"prompt": p, "n_predict": 4, "temperature": 0, "ignore_eos": True,
                        "return_tokens": True}
                r = d.post("/completion", body, timeout=120)
                results[d].append((p, r.status, r.json["tokens"] if r.status == 200 else r.text))
        threads = [threading.Thread(target=run, args=(d,)) for d in (a, b)]
        for t in threads:
            t.start()
        while not results[a] and not results[b]:
            time.sleep(0.01)
        server.kill()                            # mid-run: requests are in flight
        for t in threads:
            t.join(300)
        t0 = time.perf_counter()
        after_kill = complete(b, only_a)         # on the remote, which is gone: recompute
        assert time.perf_counter() - t0 < 30
        assert after_kill[0] == complete(a, only_a, cache=False)[0]

        for d in (a, b):
            assert [s for _, s, _ in results[d]] == [200] * len(prompts[d]), results[d]
            for p, _, got in results[d]:         # every answer is the uncached one
                assert got == complete(d, p, cache=False, n=4)[0]
        assert metric(b, "ckptd_remote_errors_total") >= 1
        assert metric(a, 'ckptd_http_requests_total{route="/completion",method="POST",'
                         'status="5') == 0
    finally:
        server.kill()
        for d in (a, b):
            t0 = time.perf_counter()
            assert d.stop() == 0, d.output()
            assert time.perf_counter() - t0 < 30     # no waiting on a dead remote


def test_a_corrupt_object_and_refused_keys_never_reach_an_answer(tiny_hybrid_dir, tmp_path,
                                                                 s3_server, monkeypatch):
    for k, v in s3_server.env().items():             # for `ckptd inspect` in this process
        monkeypatch.setenv(k, v)
    url = fresh_url()
    a = spawn(tmp_path, "a", tiny_hybrid_dir, url, s3_server.env())
    b = spawn(tmp_path, "b", tiny_hybrid_dir, url, s3_server.env())
    d = spawn(tmp_path, "d", tiny_hybrid_dir, url, s3_server.env("nobody", "wrong"))
    start_all([a, b, d])
    try:
        ctx = tokens(3, 3000)
        want, _, _ = complete(a, ctx)
        wait_uploaded(a)
        s3 = s3_server.client()
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=url[len(f"s3://{BUCKET}/"):])
        # The segment the deepest state names: the largest. On a busy machine a state
        # before the end (a tail snapshot) may have gone up while the chain still grew,
        # with a shorter segment of the same blocks, which stays good.
        name = max((o for o in listed["Contents"] if "/seg/" in o["Key"]),
                   key=lambda o: o["Size"])["Key"]
        body = bytearray(s3.get_object(Bucket=BUCKET, Key=name)["Body"].read())
        flip_block(body, 80, 0x10)                 # one bit of block 80's frame
        s3.put_object(Bucket=BUCKET, Key=name, Body=bytes(body))

        got, cached, tier = complete(b, ctx)
        assert got == want
        st = stats(b)["remote"]
        assert st["fetch"]["corrupt"] == 1 and stats(b)["corrupt_dropped"] >= 1
        # B deleted the bad segment (and the state it read, which named it) and, having
        # computed the context, put segments and states back: nothing names what is not
        # there, and every value checks (an absent object: for the next daemon to put).
        assert s3.list_objects_v2(Bucket=BUCKET, Prefix=name).get("KeyCount") == 0
        wait_uploaded(b)
        assert main(["inspect", "--remote", url, "verify"]) == 0
        c = spawn(tmp_path, "c", tiny_hybrid_dir, url, s3_server.env())
        start_all([c])
        try:
            got, cached, tier = complete(c, ctx)
            assert got == want and tier == "remote" and cached >= 2048, (cached, tier)
        finally:
            assert c.stop() == 0, c.output()

        # Refused keys (403): served from the local tiers, which are empty: recomputed.
        got, cached, tier = complete(d, ctx)
        assert got == want and cached == 0 and tier is None
        assert metric(d, 'ckptd_remote_errors_total{kind="denied"}') >= 1
        assert metric(d, "ckptd_remote_uploads_total") == metric(
            d, 'ckptd_remote_uploads_total{result="failed"}') + metric(
            d, 'ckptd_remote_uploads_total{result="dropped"}')
        for x in (a, b, d):
            assert metric(x, 'ckptd_http_requests_total{route="/completion",method="POST",'
                             'status="5') == 0
    finally:
        for x in (a, b, d):
            assert x.stop() == 0, x.output()


def test_a_slow_or_hung_remote_costs_a_recompute_not_a_stall(tiny_hybrid_dir, tmp_path,
                                                             s3_server):
    url = fresh_url()
    proxy = SlowProxy(s3_server.port, delay=0.05, rate=20_000).start()
    a = spawn(tmp_path, "a", tiny_hybrid_dir, url, s3_server.env())
    b = spawn(tmp_path, "b", tiny_hybrid_dir, url,
              {**s3_server.env(), "AWS_ENDPOINT_URL": proxy.endpoint})
    start_all([a, b])
    try:
        ctx = tokens(4, 3000)
        want, _, _ = complete(a, ctx)
        wait_uploaded(a)
        # ~750 KB at 20 KB/s a connection: far past the restore's deadline, which is
        # what recomputing 3,000 tokens is expected to take (1.5 s at first).
        t0 = time.perf_counter()
        got, cached, tier = complete(b, ctx)
        took = time.perf_counter() - t0
        assert got == want and tier != "remote"
        assert took < 12, took                   # deadline, a recompute, slack for CI
        assert stats(b)["remote"]["fetch"]["late"] >= 1

        proxy.stall = True                       # now it hangs: connections, no answers
        other = tokens(5, 3000)
        t0 = time.perf_counter()
        got, _, _ = complete(b, other)
        assert time.perf_counter() - t0 < 12
        assert got == complete(a, other, cache=False)[0]
        s = stats(b)
        assert s["remote"]["errors"]["timeout"] >= 1
        # Its uploads wait or are dropped; serving goes on.
        up = s["remote"]["uploads"]
        assert up["uploaded"] + up["exists"] + up["depth"] + up["dropped"] + up["failed"] > 0
        assert complete(b, other)[1] >= 0.95 * len(other)      # from its own tiers
    finally:
        for x in (a, b):
            t0 = time.perf_counter()
            assert x.stop() == 0, x.output()
            assert time.perf_counter() - t0 < 30
        proxy.stop()

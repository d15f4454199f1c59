"""`ckptd inspect --remote` against a real S3 server (SeaweedFS): stats per model, ls,
verify finding a flipped byte, gc by age and size touching one model's objects only,
and one-line errors for bad input."""

from __future__ import annotations

import json

import pytest

from ckptd.cache.remote.client import RemoteConfig
from ckptd.cache.remote.layout import RemoteURL
from ckptd.cache.remote.tier import RemoteTier
from ckptd.cache.store.store import CacheStore
from ckptd.tools.cli import main
from tests.cache.conftest import FP, fill, hybrid_spec
from tests.s3 import BUCKET, fresh_url

TOKENS = list(range(3, 3 + 4 * 20 + 2))


@pytest.fixture
def shared(s3_server, monkeypatch, tmp_path):
    """A prefix holding one context of model FP and one of model fp-other."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    url = fresh_url()
    spec = hybrid_spec()
    for fp in (FP, "fp-other"):
        tier = RemoteTier(RemoteConfig(RemoteURL.parse(url)), fp, spec)
        with CacheStore(tmp_path / fp, spec, fp, remote=tier) as s:
            fill(s, spec, TOKENS if fp == FP else TOKENS[:40])
            assert s.flush(30) and tier.flush(30)
    return url


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["inspect", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def as_json(capsys, *args: str) -> dict:
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_stats_ls_verify_gc(shared, capsys, s3_server):
    st = as_json(capsys, "--remote", shared, "stats")
    models = {m["fingerprint"]: m for m in st["models"]}
    assert set(models) == {FP, "fp-other"}
    assert (models[FP]["blocks"], models[FP]["snapshots"], models[FP]["markers"]) == (20, 1, 1)
    assert models["fp-other"]["blocks"] == 10 and st["objects"] == 22 + 12

    code, _, err = run(capsys, "--remote", shared, "ls")
    assert code == 2 and err.count("\n") == 1 and "--fingerprint" in err
    ls = as_json(capsys, "--remote", shared, "--fingerprint", FP, "ls", "--kind", "snapshot")
    assert ls["total"] == 1 and ls["entries"][0]["kind"] == "snapshot"
    code, out, _ = run(capsys, "--remote", shared, "--fingerprint", FP, "ls", "--limit", "0")
    assert code == 0 and "21 objects" in out

    assert as_json(capsys, "--remote", shared, "--fingerprint", FP, "verify")["bad"] == []
    s3 = s3_server.client()
    victim = ls["entries"][0]["key"]
    name = next(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=shared[len(
        f"s3://{BUCKET}/"):])["Contents"] if o["Key"].endswith(victim) and "/after/" not in
        o["Key"])
    body = bytearray(s3.get_object(Bucket=BUCKET, Key=name)["Body"].read())
    body[-30] ^= 1
    s3.put_object(Bucket=BUCKET, Key=name, Body=bytes(body))
    code, out, _ = run(capsys, "--remote", shared, "--fingerprint", FP, "verify", "--json")
    assert code == 1 and json.loads(out)["bad"] == [victim]
    fixed = as_json(capsys, "--remote", shared, "--fingerprint", FP, "verify", "--drop")
    assert fixed["dropped"] == 2                   # the snapshot and its marker
    assert as_json(capsys, "--remote", shared, "--fingerprint", FP, "verify")["bad"] == []

    kept = as_json(capsys, "--remote", shared, "--fingerprint", FP, "gc", "--older-than",
                   "1h", "--dry-run")
    assert kept["deleted_values"] == 0
    some = as_json(capsys, "--remote", shared, "--fingerprint", FP, "gc", "--to", "10kB",
                   "--dry-run")
    assert 0 < some["deleted_values"] < 20 and some["bytes_after"] <= 10_000
    gone = as_json(capsys, "--remote", shared, "--fingerprint", FP, "gc", "--older-than", "0")
    assert gone["deleted_values"] == 20 and gone["bytes_after"] == 0
    models = {m["fingerprint"]: m for m in as_json(capsys, "--remote", shared, "stats")["models"]}
    assert set(models) == {"fp-other"} and models["fp-other"]["blocks"] == 10


@pytest.mark.parametrize("args, says", [
    (("--remote", "http://x/y", "stats"), "s3://"),
    (("--remote", "s3://A_bad/x", "stats"), "bucket"),
    (("--remote", "s3://ckptd-test/x", "tree"), "takes stats, ls, verify, gc"),
    (("--remote", "s3://ckptd-test/x", "--url", "http://127.0.0.1:1", "stats"), "not both"),
    (("--remote", "s3://ckptd-test/x", "gc"), "--older-than"),
    (("--remote", "s3://ckptd-test/x", "gc", "--older-than", "soon"), "not an age"),
    (("--fingerprint", "ab", "stats"), "goes with --remote"),
])
def test_bad_input_is_one_line(capsys, args, says):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == "" and says in err and err.count("\n") == 1, err

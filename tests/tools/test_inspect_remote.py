"""`ckptd inspect --remote` against a real S3 server (SeaweedFS): stats per model (with
the dedup ratio), ls, verify finding a flipped byte and a state whose segment is gone,
gc taking states by age and size and unnamed segments after the grace period (one
model's objects only), migrate from the first layout, and one-line errors."""

from __future__ import annotations

import json

import pytest

from ckptd.cache.entry import BLOCK, SNAPSHOT
from ckptd.cache.remote import frames, legacy
from ckptd.cache.remote.client import RemoteConfig
from ckptd.cache.remote.layout import RemoteURL, model_root
from ckptd.cache.remote.tier import RemoteTier
from ckptd.cache.store.store import CacheStore
from ckptd.tools.cli import main
from tests.cache.conftest import FP, check_restored, fill, hybrid_spec
from tests.remote_damage import flip_block
from tests.s3 import BUCKET, fresh_url

TOKENS = list(range(3, 3 + 4 * 20 + 2))
OTHER = TOKENS[:4 * 17] + list(range(900, 900 + 4 * 5 + 1))     # shares 17 blocks
SPEC = hybrid_spec()


def tier(url: str, fp: str = FP) -> RemoteTier:
    return RemoteTier(RemoteConfig(RemoteURL.parse(url), segment_bytes=8 * SPEC.page_bytes()),
                      fp, SPEC)


@pytest.fixture
def aws(s3_server, monkeypatch):
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


@pytest.fixture
def shared(aws, tmp_path):
    """A prefix holding two contexts of model FP (sharing 17 blocks) and one of model
    fp-other."""
    url = fresh_url()
    for fp, contexts in ((FP, (TOKENS, OTHER)), ("fp-other", (TOKENS[:40],))):
        with CacheStore(tmp_path / fp, SPEC, fp, remote=tier(url, fp)) as s:
            for t in contexts:
                fill(s, SPEC, t)
                assert s.flush(30) and s.remote.flush(30)
    return url


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["inspect", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def as_json(capsys, *args: str, code: int = 0) -> dict:
    got, out, err = run(capsys, *args, "--json")
    assert got == code, err
    return json.loads(out)


def objects(s3, url: str, part: str) -> list[str]:
    got = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=url[len(f"s3://{BUCKET}/"):])
    return [o["Key"] for o in got.get("Contents", []) if part in o["Key"]]


def test_stats_ls_and_the_dedup_ratio(shared, capsys):
    st = as_json(capsys, "--remote", shared, "stats")
    models = {m["fingerprint"]: m for m in st["models"]}
    assert set(models) == {FP, "fp-other"}
    m = models[FP]
    # TOKENS: cells 0-7, 8-15, then 16-19; OTHER: its own cell 16-22 and the states.
    assert (m["segments"], m["states"], m["legacy_objects"]) == (4, 2, 0)
    assert m["bytes"] == m["segment_bytes"] + m["state_bytes"]
    assert m["dedup_ratio"] > 1.3                # 16 of OTHER's 22 blocks are shared
    assert models["fp-other"]["segments"] == 2 and st["objects"] == 6 + 3
    code, out, _ = run(capsys, "--remote", shared, "stats")
    assert code == 0 and "dedup" in out

    code, _, err = run(capsys, "--remote", shared, "ls")
    assert code == 2 and err.count("\n") == 1 and "--fingerprint" in err
    ls = as_json(capsys, "--remote", shared, "--fingerprint", FP, "ls", "--kind", "snapshot")
    assert ls["total"] == 2 and {e["position"] for e in ls["entries"]} == {82, 89}
    code, out, _ = run(capsys, "--remote", shared, "--fingerprint", FP, "ls", "--limit", "0")
    assert code == 0 and "6 objects" in out


def test_verify_finds_damage_and_dangling_states(shared, capsys, aws):
    args = ("--remote", shared, "--fingerprint", FP)
    ok = as_json(capsys, *args, "verify")
    assert ok["bad"] == ok["dangling"] == [] and ok["checked"] == 6 and ok["unreferenced"] == 0
    s3 = aws.client()
    seg = sorted(objects(aws, shared, f"{FP}/g8/seg/"))[0]
    body = bytearray(s3.get_object(Bucket=BUCKET, Key=seg)["Body"].read())
    flip_block(body, 0)                                      # a byte of its first frame
    s3.put_object(Bucket=BUCKET, Key=seg, Body=bytes(body))
    out = as_json(capsys, *args, "verify", code=1)
    users = out["dangling"]
    assert out["bad"] == [seg] and users                     # and the states naming it
    fixed = as_json(capsys, *args, "verify", "--drop")
    assert fixed["dropped"] == 1 + len(users)
    clean = as_json(capsys, *args, "verify")
    assert clean["bad"] == clean["dangling"] == []


def test_gc_takes_states_then_segments_past_the_grace(shared, capsys, aws):
    args = ("--remote", shared, "--fingerprint", FP)
    # A segment no state names (an upload cut short before its state went up).
    s3 = aws.client()
    seg = sorted(objects(aws, shared, f"{FP}/g8/seg/"))[0]
    body = s3.get_object(Bucket=BUCKET, Key=seg)["Body"].read()
    h = frames.read_header(body)
    page = frames.unpack(frames.frame_bodies(body, h)[0], h.frames[0], h.block_bytes)[
        :h.block_bytes]                                          # its first block alone
    first, _ = frames.pack(h.start, h.parent, [h.keys[0]], [page], h.tensor, h.block_bytes,
                           h.block_bytes)
    s3.put_object(Bucket=BUCKET, Key=f"{seg.rsplit('/', 1)[0]}/{h.keys[0].hex()}.f",
                  Body=first)
    assert as_json(capsys, *args, "verify")["unreferenced"] == 1
    kept = as_json(capsys, *args, "gc", "--older-than", "1h")
    assert kept["deleted_states"] == kept["deleted_segments"] == 0       # all young
    some = as_json(capsys, *args, "gc", "--to", "10kB", "--grace", "0", "--dry-run")
    assert some["deleted_states"] >= 1 and some["bytes_after"] <= 10_000
    assert as_json(capsys, *args, "gc", "--older-than", "1h", "--grace", "0")[
        "deleted_segments"] == 1
    gone = as_json(capsys, *args, "gc", "--older-than", "0")
    assert gone["deleted_states"] == 2 and gone["deleted_segments"] == 0    # the grace
    assert len(objects(aws, shared, f"{FP}/g8/seg/")) == 4
    assert as_json(capsys, *args, "gc", "--older-than", "0", "--grace", "0")[
        "bytes_after"] == 0
    models = {m["fingerprint"]: m for m in as_json(capsys, "--remote", shared, "stats")["models"]}
    assert set(models) == {"fp-other"} and models["fp-other"]["states"] == 1


def test_migrate_rewrites_the_first_layout(aws, capsys, tmp_path):
    url = fresh_url()
    with CacheStore(tmp_path / "a", SPEC, FP) as a:         # no remote: LMDB only
        fill(a, SPEC, TOKENS)
        assert a.flush(30)
        items = [(k, m, a.disk.read_many([(k, m.kind)], lambda _, b: bytes(b))[0])
                 for k, m in a.catalog.index.rows.items()]
    s3, root = aws.client(), model_root(RemoteURL.parse(url), FP)
    for key, meta, value in items:                   # as the first layout's uploader did
        s3.put_object(Bucket=BUCKET, Key=legacy.name(root, key, meta.kind),
                      Body=legacy.pack(meta, value))
        if meta.kind == SNAPSHOT:
            s3.put_object(Bucket=BUCKET, Key=legacy.marker(root, meta.parent, key), Body=b"")
    assert sum(m.kind == BLOCK for _, m, _ in items) == 20
    st = as_json(capsys, "--remote", url, "stats")["models"][0]
    assert st["legacy_objects"] == 22 and st["states"] == 0
    out = as_json(capsys, "--remote", url, "migrate", "--segment-bytes",
                  str(8 * SPEC.page_bytes()))
    assert (out["states"], out["segments"], out["deleted"]) == (1, 3, 22)
    st = as_json(capsys, "--remote", url, "stats")["models"][0]
    assert st["legacy_objects"] == 0 and (st["segments"], st["states"]) == (3, 1)
    with CacheStore(tmp_path / "b", SPEC, FP, remote=tier(url)) as b:
        restored = b.load(b.lookup_remote(TOKENS, len(TOKENS), b.chain(TOKENS)))
        assert restored.ok and restored.position == len(TOKENS)
        check_restored(SPEC, restored, TOKENS)


@pytest.mark.parametrize("args, says", [
    (("--remote", "http://x/y", "stats"), "s3://"),
    (("--remote", "s3://A_bad/x", "stats"), "bucket"),
    (("--remote", "s3://ckptd-test/x", "tree"), "takes stats, ls, verify, gc, migrate"),
    (("--remote", "s3://ckptd-test/x", "--url", "http://127.0.0.1:1", "stats"), "not both"),
    (("--remote", "s3://ckptd-test/x", "gc"), "--older-than"),
    (("--remote", "s3://ckptd-test/x", "gc", "--older-than", "soon"), "not an age"),
    (("--remote", "s3://ckptd-test/x", "gc", "--older-than", "1h", "--grace", "x"), "--grace"),
    (("--fingerprint", "ab", "stats"), "goes with --remote"),
    (("migrate",), "--remote"),
])
def test_bad_input_is_one_line(capsys, args, says):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == "" and says in err and err.count("\n") == 1, err

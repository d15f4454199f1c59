"""The remote tier against a real S3 server (SeaweedFS, tests/s3.py): what one store
uploads another restores exactly, in a few ranged GETs; salts, models and damage never
get through; a remote that fails or refuses costs requests, never a wrong value or a
blocked put."""

from __future__ import annotations

import time

import pytest

from ckptd.cache.lookup import REMOTE
from ckptd.cache.remote.client import RemoteConfig
from ckptd.cache.remote.layout import RemoteURL
from ckptd.cache.remote.tier import RemoteTier
from ckptd.tools.bench.slow_proxy import SlowProxy
from tests.cache.conftest import FP, check_restored, fill
from tests.remote_damage import flip_block
from tests.s3 import BUCKET, READER_KEY, READER_SECRET, fresh_url

TOKENS = list(range(3, 3 + 4 * 20 + 2))          # 20 blocks of 4, and 2 tokens
GRID = 8                                          # blocks a segment
FRAME = 2                                         # blocks a frame


@pytest.fixture
def aws(s3_server, monkeypatch):
    """The standard AWS variables pointing at the test server."""
    def use(**env):
        for k, v in {**s3_server.env(), **env}.items():
            monkeypatch.setenv(k, v)
    use()
    return use


def remote(spec, url: str, fingerprint: str = FP, **options) -> RemoteTier:
    options.setdefault("segment_bytes", GRID * spec.page_bytes())
    options.setdefault("frame_bytes", FRAME * spec.page_bytes())
    return RemoteTier(RemoteConfig(RemoteURL.parse(url), **options), fingerprint, spec)


def uploaded(open_store, spec, url: str, path, tokens=TOKENS, salt=None, **options):
    """A store that put `tokens` (blocks and a snapshot) and uploaded them all."""
    a = open_store(spec, path=path, remote=remote(spec, url, **options))
    fill(a, spec, tokens, salt)
    assert a.flush(30) and a.remote.flush(30)
    return a


def names(s3_server, url: str) -> list[str]:
    prefix = url.split("/", 3)[3]
    got = s3_server.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return [o["Key"][len(prefix):] for o in got]


def test_a_second_store_restores_what_the_first_uploaded(aws, open_store, spec, tmp_path,
                                                         s3_server):
    url = fresh_url()
    a = uploaded(open_store, spec, url, tmp_path / "a")
    up = a.stats()["remote"]["uploads"]
    # Blocks 0-7 and 8-15 (two full cells), 16-19 (where the chain ends), the state.
    assert (up["segments"], up["states"]) == (3, 1) and up["failed"] == up["dropped"] == 0
    objs = names(s3_server, url)
    assert sum("/seg/" in n for n in objs) == 3 and sum("/state/" in n for n in objs) == 1
    assert len(objs) == 4

    b = open_store(spec, path=tmp_path / "b", remote=remote(spec, url))
    chain = b.chain(TOKENS)
    assert b.lookup(TOKENS).position == 0
    plan = b.lookup_remote(TOKENS, len(TOKENS), chain)
    assert plan.position == len(TOKENS) and plan.tier == REMOTE
    assert {p.tier for p in plan.pieces()} == {REMOTE}
    restored = b.load(plan)
    assert restored.ok and restored.tier == REMOTE
    check_restored(spec, restored, TOKENS)
    st = b.stats()["remote"]
    # Found by one head GET (the state at the prompt's end, asked for beside a LIST of
    # each of the prompt's 3 cells; the LISTs not yet sent when the head came back
    # usable are not sent); read with a ranged GET a segment and one for the snapshot:
    # 10 frames of 2 blocks and the snapshot, 4 requests.
    assert 1 <= st["lookups"]["requests"] <= 3 + 1
    assert st["fetch"]["objects"] == 11 and st["fetch"]["requests"] == 4
    # Kept in LMDB: the next plan is local, and nothing went back up.
    assert b.flush(30)
    local = b.lookup(TOKENS)
    assert local.position == len(TOKENS) and REMOTE not in local.bytes_by_tier()
    check_restored(spec, b.load(local), TOKENS)
    assert b.remote.flush(30)
    st = b.stats()["remote"]
    assert st["uploads"]["uploaded"] == st["uploads"]["exists"] == 0
    assert st["requests"]["put"] == 0
    b.sanity_check()


def test_the_head_at_the_prompt_s_end_is_asked_for_beside_the_lists(aws, open_store, spec,
                                                                      tmp_path):
    """A prompt that ends where a state is: its head's GET goes with the LISTs and is
    the one read (1 GET and at most the 3 LISTs: those not sent yet when the head came
    back usable are not sent). A longer prompt: that guess misses (404), and the head
    the LISTs found is read after them (3 + 1 + 1)."""
    url = fresh_url()
    uploaded(open_store, spec, url, tmp_path / "a")
    b = open_store(spec, path=tmp_path / "b", remote=remote(spec, url))
    longer = TOKENS + [9, 9, 9, 9, 9]
    for n, (prompt, least, most) in enumerate([(TOKENS, 1, 3 + 1),
                                               (longer, 3 + 1 + 1, 3 + 1 + 1)]):
        before = b.stats()["remote"]["lookups"]["requests"]
        plan = b.lookup_remote(prompt, len(prompt), b.chain(prompt))
        assert plan.position == len(TOKENS), n
        asked = b.stats()["remote"]["lookups"]["requests"] - before
        assert least <= asked <= most, (n, asked)
    check_restored(spec, b.load(plan), TOKENS)


def test_ranges_cut_values_in_parts_and_join_them(aws, open_store, spec, tmp_path):
    """A range smaller than one frame: each comes in several ranged GETs, in parallel,
    and is decoded once its last part is in."""
    url = fresh_url()
    uploaded(open_store, spec, url, tmp_path / "a")
    b = open_store(spec, path=tmp_path / "b", remote=remote(spec, url, range_bytes=100))
    plan = b.lookup_remote(TOKENS, len(TOKENS), b.chain(TOKENS))
    check_restored(spec, b.load(plan), TOKENS)
    fetch = b.stats()["remote"]["fetch"]
    assert fetch["objects"] == 11 and fetch["requests"] >= fetch["bytes"] // 100


def test_what_a_restore_read_is_kept_whatever_the_write_queue_bound(aws, open_store, spec,
                                                                    tmp_path):
    url = fresh_url()
    uploaded(open_store, spec, url, tmp_path / "a")
    b = open_store(spec, path=tmp_path / "b", remote=remote(spec, url), queue_bytes=1024)
    plan = b.lookup_remote(TOKENS, len(TOKENS), b.chain(TOKENS))
    assert b.load(plan).ok and b.flush(30)
    assert b.stats()["write_queue"]["dropped"] == 0
    assert b.lookup(TOKENS).position == len(TOKENS)


def test_local_blocks_first_the_remote_only_beyond(aws, open_store, spec, tmp_path):
    url = fresh_url()
    uploaded(open_store, spec, url, tmp_path / "a")
    b = open_store(spec, path=tmp_path / "b", remote=remote(spec, url))
    fill(b, spec, TOKENS[:4 * 12])               # B holds the first 12 blocks itself
    assert b.flush(30)
    plan = b.lookup_remote(TOKENS, len(TOKENS), b.chain(TOKENS), floor=4 * 12)
    tiers = [p.tier for p in plan.pieces()]
    assert REMOTE not in tiers[:12]
    assert tiers[12:] == [REMOTE] * 9            # blocks 12..19 and the snapshot
    check_restored(spec, b.load(plan), TOKENS)
    fetch = b.stats()["remote"]["fetch"]
    # Only their frames: the end of one segment, another whole, the snapshot.
    assert fetch["objects"] == 2 + 2 + 1 and fetch["requests"] == 3


def test_other_salts_and_models_find_nothing(aws, open_store, spec, tmp_path):
    url = fresh_url()
    uploaded(open_store, spec, url, tmp_path / "a", salt="tenant-A")
    b = open_store(spec, path=tmp_path / "b", remote=remote(spec, url))
    for salt in (None, "tenant-B"):
        plan = b.lookup_remote(TOKENS, len(TOKENS), b.chain(TOKENS, salt))
        assert plan.position == 0 and not plan.pieces()
    assert b.lookup_remote(TOKENS, len(TOKENS), b.chain(TOKENS, "tenant-A")).position > 0
    c = open_store(spec, path=tmp_path / "c", fingerprint="fp-other",
                   remote=remote(spec, url, "fp-other"))
    assert c.lookup_remote(TOKENS, len(TOKENS), c.chain(TOKENS, "tenant-A")).position == 0


def test_corrupt_and_missing_segments_end_the_restore_below_them(aws, open_store, spec,
                                                                  tmp_path, s3_server):
    url = fresh_url()
    a = uploaded(open_store, spec, url, tmp_path / "a")
    s3 = s3_server.client()
    chain = a.chain(TOKENS)
    bad = a.remote.layout.segment(chain.keys[7], chain.keys[15])      # blocks 8-15
    body = bytearray(s3.get_object(Bucket=BUCKET, Key=bad)["Body"].read())
    assert flip_block(body, 2) == 2              # block 10's frame (10-11)
    s3.put_object(Bucket=BUCKET, Key=bad, Body=bytes(body))
    b = open_store(spec, path=tmp_path / "b", remote=remote(spec, url))
    plan = b.lookup_remote(TOKENS, len(TOKENS), chain)
    assert plan.position == len(TOKENS)          # the search can't see damage
    restored = b.load(plan)
    assert not restored.ok and restored.position == 10 * 4 and restored.dropped == FRAME
    assert b.stats()["remote"]["fetch"]["corrupt"] == 1
    # The bad segment is gone, for the next daemon that computes it to put back, and so
    # is the state that named it (it would name what is not there).
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=bad).get("KeyCount") == 0
    assert not [n for n in names(s3_server, url) if "/state/" in n]
    # What was good before it was kept (a hybrid has no snapshot there to restore).
    assert b.flush(30)
    assert b.has(chain.keys[9]) and not b.has(chain.keys[10])
    assert b.lookup(TOKENS).position == (0 if spec.is_hybrid else 10 * 4)
    # A missing segment ends a restore the same way.
    url = fresh_url()
    a = uploaded(open_store, spec, url, tmp_path / "a2")
    s3.delete_object(Bucket=BUCKET, Key=a.remote.layout.segment(chain.keys[15], chain.keys[19]))
    c = open_store(spec, path=tmp_path / "c", remote=remote(spec, url))
    restored = c.load(c.lookup_remote(TOKENS, len(TOKENS), chain))
    assert not restored.ok and restored.position == 16 * 4
    assert not [n for n in names(s3_server, url) if "/state/" in n]


def test_a_dead_remote_costs_one_failed_request_then_is_skipped(aws, open_store, spec,
                                                                tmp_path):
    aws(AWS_ENDPOINT_URL="http://127.0.0.1:9")   # the discard port: refused at once
    b = open_store(spec, path=tmp_path / "b",
                   remote=remote(spec, fresh_url(), backoff=0.01, upload_attempts=2))
    t0 = time.perf_counter()
    plan = b.lookup_remote(TOKENS, len(TOKENS), b.chain(TOKENS))
    assert plan.position == 0 and time.perf_counter() - t0 < 2
    assert b.lookup_remote(TOKENS, len(TOKENS), b.chain(TOKENS)) is None   # cooling off
    fill(b, spec, TOKENS)                        # puts go to LMDB as ever
    assert b.flush(30) and b.lookup(TOKENS).position == len(TOKENS)
    st = b.stats()["remote"]
    assert st["available"] is False and st["errors"]["unreachable"] >= 1
    assert st["lookups"]["skipped"] == 1
    t0 = time.perf_counter()
    b.close()                                    # no waiting on a remote that is down
    assert time.perf_counter() - t0 < 5


def test_a_full_upload_queue_drops_and_counts(aws, open_store, spec, tmp_path):
    aws(AWS_ENDPOINT_URL="http://127.0.0.1:9")
    b = open_store(spec, path=tmp_path / "b",
                   remote=remote(spec, fresh_url(), queue_entries=4, backoff=0.01))
    fill(b, spec, TOKENS)
    assert b.flush(30)
    up = b.stats()["remote"]["uploads"]
    # At most 4 entries wait (queued, waiting states, the batch going up, which waits
    # for the remote); those offered beyond were dropped, counted.
    assert up["dropped"] >= 1 and up["depth"] <= 4


def test_the_queue_holds_keys_and_reads_values_back_when_their_turn_comes(
        aws, s3_server, open_store, spec, tmp_path):
    proxy = SlowProxy(s3_server.port, stall=True).start()
    try:
        aws(AWS_ENDPOINT_URL=proxy.endpoint)
        b = open_store(spec, path=tmp_path / "b", remote=remote(spec, fresh_url()))
        fill(b, spec, TOKENS)
        assert b.flush(30)
        assert b.evict_to(0)["stored_bytes_after"] == 0     # gone before their turn
        proxy.stall = False
        assert b.remote.flush(30)
        up = b.stats()["remote"]["uploads"]
        # The batch read LMDB when its turn came: the state's blocks were gone.
        assert up["evicted"] == 1 and up["states"] == 0
    finally:
        proxy.stop()


def test_refused_credentials(aws, open_store, spec, tmp_path):
    url = fresh_url()
    uploaded(open_store, spec, url, tmp_path / "a")
    # Read-only keys: restores work, uploads are refused once each (no retries).
    aws(AWS_ACCESS_KEY_ID=READER_KEY, AWS_SECRET_ACCESS_KEY=READER_SECRET)
    r = open_store(spec, path=tmp_path / "r", remote=remote(spec, url))
    plan = r.lookup_remote(TOKENS, len(TOKENS), r.chain(TOKENS))
    check_restored(spec, r.load(plan), TOKENS)
    fill(r, spec, TOKENS + [7, 7, 7])
    assert r.flush(30) and r.remote.flush(30)
    st = r.stats()["remote"]
    assert st["uploads"]["failed"] >= 1 and st["uploads"]["retries"] == 0
    assert st["errors"]["denied"] >= 1 and st["available"] is True
    # Unknown keys: nothing is read, nothing served, the store goes on locally.
    aws(AWS_ACCESS_KEY_ID="nobody", AWS_SECRET_ACCESS_KEY="x")
    n = open_store(spec, path=tmp_path / "n", remote=remote(spec, url))
    assert n.lookup_remote(TOKENS, len(TOKENS), n.chain(TOKENS)).position == 0
    assert n.stats()["remote"]["errors"]["denied"] >= 1

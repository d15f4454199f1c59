"""CacheStore on a real LMDB: tiers, lookup rules, restart, corruption, budgets, admin."""

from __future__ import annotations

import pytest
import torch

from ckptd.cache.snapshot import Snapshot
from ckptd.model.spec import AttentionSpec, RecurrentSpec, StateSpec
from tests.cache.conftest import (
    B,
    attention_spec,
    check_restored,
    fake_pages,
    fake_snapshot,
    fill,
    flip_value,
    hybrid_spec,
)


def test_round_trip_host_disk_and_restart(open_store, spec, tmp_path):
    tokens = list(range(100, 123))                      # 5 full blocks + 3
    s = open_store(spec)
    fill(s, spec, tokens)
    plan = s.lookup(tokens)
    assert plan.position == 23 and plan.tier == "host" and plan.snapshot is not None
    check_restored(spec, s.load(plan), tokens)
    s.close()
    s = open_store(spec)                                # restart: only the disk tier
    plan = s.lookup(tokens + [1, 2, 3])
    assert plan.position == 23 and plan.tier == "disk"
    assert plan.bytes_by_tier()["disk"] == plan.total_bytes > 0
    restored = s.load(plan)
    assert restored.ok and restored.tier == "disk"
    check_restored(spec, restored, tokens)
    s.flush()
    # a block goes into RAM on its second read from disk (the first one's pages stay on
    # the device in the daemon); the snapshot at once
    again = s.lookup(tokens + [1, 2, 3])
    assert again.tier == "disk" and again.snapshot.tier == "host"
    check_restored(spec, s.load(again), tokens)
    s.flush()                                           # blocks are promoted after it
    assert s.lookup(tokens + [1, 2, 3]).tier == "host"  # promoted by the second load
    assert s.stats()["read_bytes"]["disk"] == plan.total_bytes + again.bytes_by_tier()["disk"]


def test_load_into_strided_pool_pages(open_store, spec):
    """into_pages: blocks decode straight into the caller's pool pages (a head-major CPU
    pool's pages are strided views), and a damaged value stops the restore there with
    the good blocks in place. (RAM hits into pool pages: tests/daemon/test_engine.py.)"""
    from ckptd.kernels.paged_attention import layout
    tokens = list(range(200, 243))                      # 10 full blocks + 3
    s = open_store(spec, host_budget=0)
    fill(s, spec, tokens)
    s.flush()
    plan = s.lookup(tokens + [7])
    n = len(plan.blocks)
    assert plan.position == 43 and n == 10 and plan.tier == "disk"
    pool = layout.new_pool(n + 2, spec.kv_shape(), spec.attention.dtype,
                           torch.device("cpu"), head_major=True)
    views = [pool[i + 2] for i in range(n)]            # not the first pages: offsets too
    assert not views[0].is_contiguous()
    restored = s.load(plan, views)
    assert restored.ok and restored.pages is None and restored.position == plan.position
    assert torch.equal(pool[2:2 + n], s.load(plan).pages)   # the same as a plain load
    check_restored(spec, s.load(plan), tokens)
    # a block damaged on disk: the restore ends before it, its good blocks written
    bad = plan.blocks[4].key
    _overwrite(s, bad)
    pool.zero_()
    again = s.load(s.lookup(tokens + [7]), views)
    assert not again.ok and again.pages is None
    good = again.position // B
    assert good <= 4
    if good:
        assert torch.equal(pool[2:2 + good], fake_pages(spec, tokens, 0, good))


def _overwrite(s, key: bytes) -> None:
    with s.disk.env.begin(write=True, db=s.disk.blocks) as txn:
        txn.put(key, b"not a value")


@pytest.mark.parametrize("kv_dtype,conv_dtype", [(torch.float32, torch.float32),
                                                 (torch.float16, torch.float16),
                                                 (torch.bfloat16, torch.float32)])
def test_every_dtype_bit_exact_through_disk(open_store, kv_dtype, conv_dtype):
    spec = StateSpec(B, AttentionSpec(2, 3, 5, kv_dtype),
                     RecurrentSpec(2, 6, 3, 2, 3, 5, conv_dtype=conv_dtype))
    tokens = list(range(10))
    s = open_store(spec, host_budget=0)
    fill(s, spec, tokens)
    s.flush()
    restored = s.load(s.lookup(tokens))
    assert restored.tier == "disk" and restored.position == 10
    check_restored(spec, restored, tokens)
    assert restored.pages.dtype == kv_dtype and restored.snapshot.conv.dtype == conv_dtype


def test_lookup_rules(open_store, spec):
    tokens = list(range(40))
    s = open_store(spec)
    fill(s, spec, tokens)
    for t in (8, 20, 22, 36):
        fill(s, spec, tokens[:t])
    # a hybrid restores at a snapshot only; attention KV is cut anywhere it is cached
    hybrid = spec.is_hybrid
    assert s.lookup(tokens).position == 40
    assert s.lookup(tokens, max_tokens=39).position == (36 if hybrid else 39)
    assert s.lookup(tokens, max_tokens=21).position == (20 if hybrid else 21)
    assert s.lookup(tokens, max_tokens=35).position == (22 if hybrid else 35)
    other = tokens[:23] + [999] * 20                    # diverges inside block 5
    assert s.lookup(other).position == (22 if hybrid else 23)
    r = s.load(s.lookup(other))
    check_restored(spec, r, other)
    assert s.lookup([999] + tokens[1:]).position == 0
    assert s.lookup(tokens, salt="tenant-b").position == 0
    assert s.lookup(tokens, extras=[b"image"]).position == 0
    assert s.lookup(tokens, max_tokens=0).position == 0
    st = s.stats()["lookups"]
    assert st["count"] == 10 and st["hits"] == 6


def test_exact_repeat_can_restore_logits(open_store):
    spec = attention_spec()
    tokens = list(range(8))
    s = open_store(spec)
    s.put_blocks(tokens, 0, fake_pages(spec, tokens, 0, 2))
    s.put_snapshot(tokens, Snapshot(logits=torch.arange(5.0)))   # aligned: logits only
    plan = s.lookup(tokens)
    assert plan.position == 8 and plan.snapshot is not None
    assert torch.equal(s.load(plan).snapshot.logits, torch.arange(5.0))


def test_corrupt_value_is_dropped_and_the_good_prefix_served(open_store, spec, tmp_path):
    tokens = list(range(30))
    s = open_store(spec)
    for t in (9, 30):
        fill(s, spec, tokens[:t])
    bad_key = s.lookup(tokens).blocks[4].key
    s.close()
    flip_value(tmp_path / "store", b"blocks", bad_key)
    s = open_store(spec)
    plan = s.lookup(tokens)
    assert plan.position == 30
    restored = s.load(plan)
    assert not restored.ok and restored.dropped == 1 and restored.position == 16
    # blocks 0-3 are good: planned again, a hybrid falls back to its snapshot at 9,
    # attention to 16
    assert s.stats()["corrupt_dropped"] == 1
    again = s.lookup(tokens)
    assert bad_key not in [p.key for p in again.pieces()]
    assert again.position == (9 if spec.is_hybrid else 16)
    got = s.load(again)
    assert got.ok
    check_restored(spec, got, tokens)


def test_corrupt_snapshot_never_served(open_store, tmp_path):
    spec = hybrid_spec()
    tokens = list(range(10))
    s = open_store(spec)
    fill(s, spec, tokens)
    key = s.lookup(tokens).snapshot.key
    s.close()
    flip_value(tmp_path / "store", b"snapshots", key)
    s = open_store(spec)
    restored = s.load(s.lookup(tokens))
    assert (restored.ok, restored.snapshot) == (False, None)
    assert s.lookup(tokens).position == 0 and s.get_info(key.hex()) is None


def test_another_model_never_sees_entries(open_store, spec, tmp_path):
    tokens = list(range(12))
    s = open_store(spec)
    fill(s, spec, tokens)
    s.close()
    other = open_store(spec, fingerprint="another-model")
    assert other.lookup(tokens).position == 0
    assert other.stats()["disk"]["by_fingerprint"]["fp-test"]["entries"] == 4


def test_put_validation(open_store):
    spec = hybrid_spec()
    s = open_store(spec)
    toks = list(range(8))
    with pytest.raises(ValueError, match="pages must be"):
        s.put_blocks(toks, 0, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="pages must be"):
        s.put_blocks(toks, 0, fake_pages(spec, toks, 0, 2).float())
    with pytest.raises(ValueError, match="need 12 tokens"):
        s.put_blocks(toks, 1, fake_pages(spec, toks, 0, 2))
    snap = fake_snapshot(spec, toks[:6])
    with pytest.raises(ValueError, match="holds"):
        s.put_snapshot(toks[:6], Snapshot(ssm=snap.ssm, kv=snap.kv))
    with pytest.raises(ValueError, match="'kv' must be"):
        s.put_snapshot(toks[:7], snap)
    with pytest.raises(ValueError, match="at least one token"):
        s.put_snapshot([], Snapshot())
    with pytest.raises(ValueError, match="sort"):
        s.entries(sort="age")
    with pytest.raises(ValueError, match="key"):
        s.delete("not-a-key")
    with pytest.raises(ValueError, match="must be >= 0"):
        open_store(spec, disk_budget=-1)
    assert s.stats()["entries"] == 0

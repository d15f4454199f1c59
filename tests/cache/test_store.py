"""CacheStore with a real LMDB: tiers, lookup, restart, corruption, budget, pinning."""

from __future__ import annotations

import lmdb
import torch

from cache.store import CacheStore
from tests.cache.conftest import B, attention_spec, fake_pages, fake_snapshot, hybrid_spec


def _store(path, spec, **kw):
    return CacheStore(path, spec, "fp-test", **kw)


def _fill(store, spec, tokens, salt=None):
    """Blocks for every full block of tokens, and a snapshot at the end."""
    n = len(tokens) // B
    if n:
        store.put_blocks(tokens, 0, fake_pages(spec, tokens, 0, n), salt=salt)
    store.put_snapshot(tokens, fake_snapshot(spec, tokens), salt=salt)


def _check_restored(spec, restored, tokens):
    if restored.position == 0:
        return
    n = restored.position // B
    if n:
        assert torch.equal(restored.pages, fake_pages(spec, tokens, 0, n))
    if spec.is_hybrid or restored.position % B:
        want = fake_snapshot(spec, tokens[:restored.position])
        for k, v in want.items():
            assert torch.equal(restored.snapshot[k], v), k


def test_round_trip_host_disk_and_restart(tmp_path, spec):
    tokens = list(range(100, 123))                      # 5 full blocks + 3
    s = _store(tmp_path, spec)
    _fill(s, spec, tokens)
    plan = s.lookup(tokens)
    assert plan.position == 23 and plan.tier == "host"
    _check_restored(spec, s.load(plan), tokens)
    s.close()
    s = _store(tmp_path, spec)                          # restart: only the disk tier
    plan = s.lookup(tokens + [1, 2, 3])
    assert plan.position == 23 and plan.tier == "disk"
    _check_restored(spec, s.load(plan), tokens)
    assert s.lookup(tokens + [1, 2, 3]).tier == "host"  # promoted by the load
    s.close()


def test_never_longer_than_max_tokens_or_common_prefix(tmp_path, spec):
    tokens = list(range(40))
    s = _store(tmp_path, spec)
    _fill(s, spec, tokens)
    for t in (8, 20, 36):
        _fill(s, spec, tokens[:t])
    s.flush()
    assert s.lookup(tokens, max_tokens=39).position == 36
    assert s.lookup(tokens, max_tokens=21).position == (20 if spec.is_hybrid else 20)
    other = tokens[:22] + [999] * 20
    assert s.lookup(other).position == 20
    assert s.lookup([999] + tokens[1:]).position == 0
    assert s.lookup(tokens, salt="tenant-b").position == 0
    s.close()


def test_corrupt_value_is_dropped_and_reported_as_miss(tmp_path):
    spec = hybrid_spec()
    tokens = list(range(12))
    s = _store(tmp_path, spec)
    _fill(s, spec, tokens)
    s.close()
    env = lmdb.open(str(tmp_path), max_dbs=4)
    db = env.open_db(b"values")
    with env.begin(write=True, db=db) as txn:
        key, blob = next(iter(txn.cursor()))
        bad = bytearray(blob)
        bad[len(bad) // 2] ^= 0xFF
        txn.put(key, bytes(bad))
    env.close()
    s = _store(tmp_path, spec)
    plan = s.lookup(tokens + [0])
    restored = s.load(plan)
    assert not restored.ok
    assert s.stats()["corrupt_dropped"] == 1
    # a new plan never includes the bad piece, and whatever it serves verifies
    plan2 = s.lookup(tokens + [0])
    pieces = [*plan2.blocks, *([plan2.snapshot] if plan2.snapshot else [])]
    assert key not in [p.key for p in pieces]
    r2 = s.load(plan2)
    assert r2.ok
    _check_restored(spec, r2, tokens)
    s.close()


def test_budget_evicts_lru_leaves_and_keeps_pinned(tmp_path):
    spec = attention_spec(torch.float32)
    block = spec.page_bytes()
    s = _store(tmp_path, spec, disk_budget=40 * block, host_budget=0)
    pinned = list(range(1000, 1000 + 8 * B))
    _fill(s, spec, pinned)
    s.flush()
    key = s.lookup(pinned).blocks[-1].key
    assert s.set_pinned(key, True) == 8                 # the block and its 7 ancestors
    for i in range(20):
        _fill(s, spec, [i] * (4 * B))                   # 20 prompts x 4 blocks
        s.flush()
        st = s.stats()["disk"]
        assert st["stored_bytes"] <= 40 * block * 1.2 + 4 * block
    assert s.lookup(pinned).position == 8 * B
    assert s.lookup([19] * (4 * B) + [0]).position == 4 * B     # most recent kept
    assert s.lookup([0] * (4 * B) + [0]).position == 0          # oldest evicted
    # closed prefixes: every entry's parent is present (or is a root)
    entries = dict(s.disk.scan())
    parents = {m.parent for m in entries.values()}
    roots = {s.root().hex()}
    assert all(p in roots or bytes.fromhex(p) in entries for p in parents)
    s.close()


def test_map_full_is_survived(tmp_path):
    spec = attention_spec(torch.float32)
    s = _store(tmp_path, spec, disk_budget=1)          # map cannot grow past its minimum
    s.disk.max_map = s.disk.env.info()["map_size"]
    big = torch.randn(300, *spec.kv_shape())
    toks = list(range(300 * B))
    s.put_blocks(toks, 0, big)
    s.flush()
    assert s.stats()["write_queue"]["failed"] + s.stats()["evictions"] > 0
    s.put_blocks([7] * B, 0, big[:1])                   # still serving writes
    s.flush()
    s.close()


def test_delete_subtree_pin_clear(tmp_path):
    spec = hybrid_spec()
    s = _store(tmp_path, spec)
    a = list(range(16))
    _fill(s, spec, a)
    _fill(s, spec, a[:8] + [50] * 8)
    s.flush()
    shared = s.lookup(a).blocks[1].key                 # blocks 0-1 are shared by both prompts
    own = s.lookup(a).blocks[2].key                    # block 2 is a's alone
    assert len(s.subtree(shared)) == 7                 # 1 + each prompt's 2 blocks + snapshot
    assert s.delete(own) == 3                          # a's blocks 2, 3 and its snapshot
    assert s.lookup(a + [0]).position == 0             # no snapshot of a is left
    assert s.lookup(a[:8] + [50] * 8 + [0]).position == 16
    assert s.clear() > 0 and s.stats()["disk"]["entries"] == 0
    s.close()

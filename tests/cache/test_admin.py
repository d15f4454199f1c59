"""The admin API the daemon and the inspector call: listing, pin, delete, verify, export."""

from __future__ import annotations

import json

import pytest

from tests.cache.conftest import attention_spec, check_restored, fill, hybrid_spec


def test_delete_takes_the_subtree(open_store):
    spec = hybrid_spec()
    s = open_store(spec)
    a, b = list(range(16)), list(range(8)) + [50] * 8
    fill(s, spec, a)
    fill(s, spec, b)
    s.flush()
    plan = s.lookup(a)
    shared, own = plan.blocks[1].key, plan.blocks[2].key   # blocks 0-1 are shared, 2-3 a's own
    assert s.delete(own.hex()) == 3                        # a's blocks 2, 3 and its snapshot
    assert s.lookup(a + [0]).position == 0                 # a has no snapshot left
    assert s.lookup(b + [0]).position == 16
    assert s.delete(shared.hex()) == 4                     # block 1 and b's 2 blocks + snapshot
    assert s.lookup(b + [0]).position == 0
    assert s.delete(shared.hex()) == 0                     # gone already
    assert s.verify().orphans == []


def test_pin_closes_upwards_and_unpin_releases_what_nothing_needs(open_store):
    spec = attention_spec()
    s = open_store(spec, disk_budget=1 << 30)
    a, b = list(range(16)), list(range(8)) + [50] * 8
    fill(s, spec, a)
    fill(s, spec, b)
    ka, kb = s.lookup(a).snapshot.key.hex(), s.lookup(b).snapshot.key.hex()
    assert s.pin(ka) == 5                                  # snapshot + 4 blocks
    assert s.pin(kb) == 3                                  # snapshot + b's own 2 blocks
    pinned = lambda: sorted(e.position for e in s.entries(limit=99) if e.pinned)  # noqa: E731
    assert pinned() == [4, 8, 12, 12, 16, 16, 16, 16]
    assert s.unpin(ka) == 3                                # blocks 0-1 are still b's
    assert pinned() == [4, 8, 12, 16, 16]
    assert s.clear() == 3 and s.lookup(b).position == 16 and s.lookup(a).position == 8
    assert s.unpin(kb) == 5 and pinned() == []
    assert s.pin("0" * 32) == 0
    assert s.clear(include_pinned=True) == 5 and s.stats()["entries"] == 0


def test_entries_info_and_stats(open_store):
    spec = hybrid_spec()
    s = open_store(spec)
    for t in (list(range(9)), list(range(20)), [7] * 5):
        fill(s, spec, t)
    s.flush()
    s.load(s.lookup(list(range(20))))
    s.load(s.lookup(list(range(20))))
    rows = s.entries(limit=100)
    assert len(rows) == s.stats()["entries"] == 2 + 3 + 1 + 3   # blocks 0-1 are shared
    assert [r.last_used for r in rows] == sorted((r.last_used for r in rows), reverse=True)
    top = s.entries(limit=1, sort="hits")[0]
    assert top.hits == 2 and set(top.tiers) == {"host", "disk"}
    assert [r.kind for r in s.entries(kind="snapshot")] == ["snapshot"] * 3
    page = s.entries(offset=2, limit=3, sort="position")
    assert [r.position for r in page] == [16, 12, 9]
    info = s.get_info(top.key)
    assert info == top and json.loads(json.dumps(info.to_dict()))["key"] == top.key
    assert s.get_info("f" * 32) is None
    st = s.stats()
    assert st["disk"]["by_kind"] == {"block": 6, "snapshot": 3}
    assert st["disk"]["by_fingerprint"]["fp-test"]["entries"] == 9
    d = st["disk"]
    assert d["compression_ratio"] == round(d["logical_bytes"] / d["stored_bytes"], 3)
    assert st["lookups"]["hits"] == 2 and st["write_queue"]["depth"] == 0
    json.dumps(st)


def test_verify_finds_and_drops_damage(open_store, tmp_path):
    import lmdb
    spec = attention_spec()
    s = open_store(spec)
    toks = list(range(12))
    fill(s, spec, toks)
    key = s.lookup(toks).blocks[1].key
    s.close()
    env = lmdb.open(str(tmp_path / "store"), max_dbs=8)
    with env.begin(write=True, db=env.open_db(b"blocks")) as txn:
        v = bytearray(txn.get(key))
        v[-3] ^= 1                                        # inside the checksum itself
        txn.put(key, bytes(v))
    env.close()
    s = open_store(spec)
    report = s.verify()
    assert report.checked == 4 and report.bad == [key.hex()] and report.dropped == 0
    report = s.verify(drop=True)
    assert report.dropped == 3                            # block 1, block 2 and the snapshot
    assert s.verify().bad == [] and s.lookup(toks).position == 4


def test_export_then_import_into_another_store(open_store, tmp_path, spec):
    s = open_store(spec)
    prompts = [list(range(10)), list(range(5)) + [9] * 6, [3] * 13]
    for p in prompts:
        fill(s, spec, p, salt="t")
    n = s.export(tmp_path / "backup")
    assert n == s.stats()["entries"]
    with pytest.raises(ValueError, match="already holds"):
        s.export(tmp_path / "backup")
    t = open_store(spec, path=tmp_path / "other")
    fill(t, spec, [1, 2, 3, 4, 5])
    assert t.import_(tmp_path / "backup") == n
    assert t.import_(tmp_path / "backup") == 0            # nothing new the second time
    for p in prompts:
        r = t.load(t.lookup(p, salt="t"))
        assert r.position == len(p)
        check_restored(spec, r, p)


def test_readonly_store_lists_but_never_writes(open_store, tmp_path):
    # (LMDB opens an environment once per process: following a live writer is
    # tested with a real second process in test_processes.py.)
    from ckptd.cache.store.store import CacheStore
    spec = attention_spec()
    s = open_store(spec)
    fill(s, spec, list(range(9)))
    s.close()
    ro = CacheStore.open_readonly(tmp_path / "store")
    assert ro.stats()["entries"] == 3
    key = ro.entries(limit=1)[0].key
    for call in (lambda: ro.delete(key), lambda: ro.pin(key), lambda: ro.clear(),
                 lambda: ro.verify(drop=True), lambda: ro.import_(tmp_path)):
        with pytest.raises(ValueError, match="read-only"):
            call()
    assert ro.verify().bad == []
    with pytest.raises(ValueError, match="spec"):
        ro.lookup([1, 2, 3])
    ro.close()
    ro = CacheStore.open_readonly(tmp_path / "store", spec, "fp-test")
    r = ro.load(ro.lookup(list(range(9))))
    assert r.position == 9
    check_restored(spec, r, list(range(9)))
    ro.close()

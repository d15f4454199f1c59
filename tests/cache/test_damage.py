"""A damaged store file: index records (metas) that no longer parse or say another
position, LMDB pages that are broken, writes the filesystem refuses. The store opens,
serves only what verifies, and counts or logs the rest."""

from __future__ import annotations

import json

import lmdb
import pytest

from ckptd.cache.entry import EntryMeta
from ckptd.cache.tiers.disk import DiskFull, DiskTier
from tests.cache.conftest import check_restored, fill, hybrid_spec


def _edit_meta(path, key: bytes, edit) -> None:
    env = lmdb.open(str(path), max_dbs=8)
    db = env.open_db(b"meta")
    with env.begin(write=True, db=db) as txn:
        txn.put(key, edit(bytes(txn.get(key))))
    env.close()


def test_meta_with_a_wrong_position_is_never_planned(open_store, tmp_path):
    # A flipped digit keeps the JSON valid: the snapshot would be restored at a position
    # it does not hold. The lookup checks the position against the key's own.
    spec = hybrid_spec()
    tokens = list(range(10))
    s = open_store(spec)
    fill(s, spec, tokens[:6])
    fill(s, spec, tokens)
    key = s.lookup(tokens).snapshot.key
    s.close()

    def shift(raw: bytes) -> bytes:
        d = json.loads(raw)
        d["position"] -= 1
        return json.dumps(d).encode()
    _edit_meta(tmp_path / "store", key, shift)
    s = open_store(spec)
    plan = s.lookup(tokens)
    assert plan.position == 6 and plan.snapshot.key != key      # the good snapshot at 6
    restored = s.load(plan)
    assert restored.ok
    check_restored(spec, restored, tokens)


@pytest.mark.parametrize("damage", [b"{", b'"kind":"wizard"', b'"pinned":"yes"'])
def test_meta_that_does_not_parse_is_dropped_at_open(open_store, tmp_path, damage):
    spec = hybrid_spec()
    tokens = list(range(10))
    s = open_store(spec)
    fill(s, spec, tokens[:6])
    fill(s, spec, tokens)
    key = s.lookup(tokens).snapshot.key
    s.close()

    def mangle(raw: bytes) -> bytes:
        if damage == b"{":
            return raw[:-3]
        field = damage.split(b":")[0]
        start = raw.index(field)
        end = raw.index(b",", start)
        return raw[:start] + damage + raw[end:]
    _edit_meta(tmp_path / "store", key, mangle)
    with pytest.raises(ValueError):
        EntryMeta.from_bytes(mangle(b'{"kind":"snapshot","parent":"' + b"00" * 16 +
                                    b'","position":10,"tokens":[8,9],"fingerprint":"f",'
                                    b'"pinned":false,"plain":true}'))
    s = open_store(spec)                      # opens; the damaged entry is gone
    assert s.get_info(key.hex()) is None
    with s.disk.env.begin(db=s.disk.meta_db) as txn:
        assert txn.get(key) is None           # deleted from the file too
    plan = s.lookup(tokens)
    assert plan.position == 6
    check_restored(spec, s.load(plan), tokens)


def test_broken_lmdb_pages_set_the_file_aside(open_store, tmp_path):
    spec = hybrid_spec()
    tokens = list(range(10))
    s = open_store(spec)
    fill(s, spec, tokens)
    s.close()
    data = tmp_path / "store" / "data.mdb"
    raw = bytearray(data.read_bytes())
    raw[:64] = bytes(64)                       # both meta pages' headers: not LMDB any more
    raw[4096:4096 + 64] = bytes(64)
    data.write_bytes(bytes(raw))
    s = open_store(spec)
    assert s.lookup(tokens).position == 0 and s.stats()["entries"] == 0
    aside = [p for p in (tmp_path / "store").iterdir() if p.name.startswith("damaged-")]
    assert len(aside) == 1 and (aside[0] / "data.mdb").exists()
    fill(s, spec, tokens)                      # and it works as a fresh store
    s.flush()
    assert s.lookup(tokens).position == 10


def test_a_refused_write_is_disk_full_and_the_store_stays_usable(tmp_path):
    # A write past RLIMIT_FSIZE fails like one to a full disk (LMDB: EIO / EFBIG).
    import resource
    disk = DiskTier(tmp_path / "store", 1 << 30)
    meta = EntryMeta("block", b"\0" * 16, 4, [1, 2, 3, 4], "fp")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (disk.file_bytes() + 8192, hard))
    try:
        with pytest.raises(DiskFull, match="write failed"):
            disk.put_many([(b"k" * 16, meta, b"x" * 200_000)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert disk.put_many([(b"k" * 16, meta, b"x" * 200_000)]) == [b"k" * 16]
    disk.close()


def test_a_value_read_under_another_key_is_caught(open_store, tmp_path):
    # A damaged page pointer can make one key's read land on another entry's bytes:
    # valid, checksummed, the same shape. The key in the value's header catches it.
    spec = hybrid_spec()
    tokens = list(range(12))
    s = open_store(spec)
    fill(s, spec, tokens)
    plan = s.lookup(tokens)
    first, second = plan.blocks[0].key, plan.blocks[1].key
    s.close()
    env = lmdb.open(str(tmp_path / "store"), max_dbs=8)
    db = env.open_db(b"blocks")
    with env.begin(write=True, db=db) as txn:
        txn.put(second, bytes(txn.get(first)))
    env.close()
    s = open_store(spec)
    restored = s.load(s.lookup(tokens))
    assert not restored.ok and restored.dropped == 1
    assert s.lookup(tokens, max_tokens=restored.position).position == 0
    assert s.lookup(tokens).position == 0


@pytest.mark.parametrize("found", [b"0", b"1", b"99", b"2\x00"])
def test_a_store_of_another_format_starts_over(open_store, tmp_path, found):
    # An older or newer format (or a damaged format record) is never read: DESIGN.md
    # drops values of another format and recomputes them.
    spec = hybrid_spec()
    tokens = list(range(10))
    s = open_store(spec)
    fill(s, spec, tokens)
    s.close()
    env = lmdb.open(str(tmp_path / "store"), max_dbs=8)
    with env.begin(write=True, db=env.open_db(b"info")) as txn:
        txn.put(b"format", found)
    env.close()
    s = open_store(spec)
    assert s.stats()["entries"] == 0 and s.lookup(tokens).position == 0
    fill(s, spec, tokens)
    s.flush()
    assert s.lookup(tokens).position == 10


def test_the_index_walk_in_a_child_tells_a_good_file_from_a_broken_one(open_store, tmp_path):
    from ckptd.cache.tiers.probe import walk_fails

    spec = hybrid_spec()
    s = open_store(spec)
    fill(s, spec, list(range(10)))
    s.close()
    store = tmp_path / "store"
    assert walk_fails(store) is None
    assert "more than" in walk_fails(store, timeout=0.001)     # a hung reader is not waited on
    data = store / "data.mdb"
    raw = bytearray(data.read_bytes())
    raw[:64] = bytes(64)
    raw[4096:4096 + 64] = bytes(64)
    data.write_bytes(bytes(raw))
    assert "failed" in walk_fails(store)

"""The LMDB structure check: real LMDB files, damaged on purpose.

What must hold: a file the check passes never crashes LMDB (read everything, then
write), and the kinds of damage LMDB can't survive are named."""

import mmap
import random
import struct
import subprocess
import sys

import lmdb
import pytest

from ckptd.cache.tiers.lmdb_check import _Check, _int_key, check_file

NAMES = (b"blocks", b"snapshots", b"meta", b"info")
# Reads every key and value, then writes and deletes across all four tables and
# several commits: what a daemon does first after a start.
USE_IT = r"""
import lmdb, random, sys
env = lmdb.open(sys.argv[1], map_size=1 << 28, max_dbs=4)
dbs = [env.open_db(n) for n in (b"blocks", b"snapshots", b"meta", b"info")]
rng = random.Random(1)
for _ in range(12):
    with env.begin(write=True) as txn:
        for d in dbs:
            for _k, _v in txn.cursor(db=d):
                pass
        for _ in range(100):
            txn.put(rng.randbytes(16), rng.randbytes(rng.choice([10, 3000, 20000])),
                    db=dbs[rng.randrange(4)])
        keys = [k for k, _ in txn.cursor(db=dbs[1])][:40]
        for k in keys[::2]:
            txn.delete(k, db=dbs[1])
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store with inline and overflow values, several tree levels and a free list."""
    path = tmp_path_factory.mktemp("lmdb")
    env = lmdb.open(str(path), map_size=1 << 28, max_dbs=4)
    dbs = [env.open_db(n) for n in NAMES]
    rng = random.Random(0)
    for _ in range(12):
        with env.begin(write=True) as txn:
            for _ in range(200):
                txn.put(rng.randbytes(16), rng.randbytes(rng.choice([10, 100, 3000, 20000])),
                        db=dbs[rng.randrange(4)])
            keys = [k for k, _ in txn.cursor(db=dbs[0])][:80]
            for k in keys[::2]:
                txn.delete(k, db=dbs[0])
    env.close()
    return (path / "data.mdb").read_bytes()


def _write(tmp_path, data: bytes):
    (tmp_path / "data.mdb").write_bytes(data)
    return tmp_path


def _structure(data: bytes) -> _Check:
    """The walked structure of an intact file (its live pages and free records)."""
    m = mmap.mmap(-1, len(data))
    m.write(data)
    c = _Check(m)
    free_db, main_db = c._pick_meta()
    c.free_records = c._walk("free list", free_db, _int_key)
    c.named = c._walk("main database", main_db, bytes, named=True)
    return c


def test_an_intact_store_passes(store, tmp_path):
    assert check_file(_write(tmp_path, store)) is None
    c = _structure(store)
    assert c.free_records, "the fixture must have a free list to check"
    assert {name for name, _ in c.named} == set(NAMES)


def test_a_free_page_that_is_also_in_use_is_named(store, tmp_path):
    c = _structure(store)
    live = next(pg for pg, n in c.used if n == 1)
    _key, (start, size) = next(r for r in c.free_records if r[1][1] >= 16)
    data = bytearray(store)
    struct.pack_into("<QQ", data, start, 1, live)       # one page listed: a live one
    assert "also in use" in check_file(_write(tmp_path, bytes(data)))


def test_a_page_with_another_number_or_keys_out_of_order_is_named(store, tmp_path):
    c = _structure(store)
    blocks = dict(c.named)[b"blocks"]
    data = bytearray(store)
    struct.pack_into("<Q", data, blocks.root * c.psize, blocks.root + 1)
    assert "says it is page" in check_file(_write(tmp_path, bytes(data)))
    # The first key of a leaf of `blocks`, made larger than every other key.
    data = bytearray(store)
    leaf = next(pg for pg, n in c.used if n == 1 and _is_leaf(store, pg, c.psize))
    first = struct.unpack_from("<H", store, leaf * c.psize + 16)[0]
    node = leaf * c.psize + first
    ksize = struct.unpack_from("<H", store, node + 6)[0]
    data[node + 8:node + 8 + ksize] = b"\xff" * ksize
    why = check_file(_write(tmp_path, bytes(data)))
    assert "out of order" in why or "above its parent's bound" in why


def _is_leaf(data: bytes, pg: int, psize: int) -> bool:
    flags, lower = struct.unpack_from("<HH", data, pg * psize + 10)
    return flags & 0x02 and (lower - 16) // 2 >= 2


def test_no_file_that_passes_crashes_lmdb(store, tmp_path):
    """Bits flipped in branch, leaf and meta pages (values are checked by their own
    checksums): every file the check passes survives LMDB reading and writing it."""
    c = _structure(store)
    pages = [pg for pg, n in c.used if n == 1] + [0, 1]
    caught = survived = 0
    for seed in range(24):
        rng = random.Random(seed)
        data = bytearray(store)
        for _ in range(1 + seed % 5):
            data[rng.choice(pages) * c.psize + rng.randrange(c.psize)] ^= 1 << rng.randrange(8)
        folder = tmp_path / f"s{seed}"
        folder.mkdir()
        why = check_file(_write(folder, bytes(data)))
        if why is not None:
            caught += 1
            continue
        r = subprocess.run([sys.executable, "-c", USE_IT, str(folder)], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode >= 0, f"seed {seed}: passed the check, crashed LMDB: {r.stderr}"
        survived += 1
    print(f"{caught} caught, {survived} passed and survived")
    assert caught and survived

"""Races, each forced: eviction between lookup and load, a child committed after its
parent went, the same block put twice at once, and a free-for-all of threads."""

from __future__ import annotations

import random
import threading

import torch

from tests.cache.conftest import (
    FP,
    B,
    attention_spec,
    check_restored,
    fake_pages,
    fill,
    hybrid_spec,
)


def test_piece_evicted_between_lookup_and_load(open_store, spec):
    s = open_store(spec, host_budget=0)
    toks = list(range(26))
    fill(s, spec, toks[:9])
    fill(s, spec, toks)
    s.flush()
    plan = s.lookup(toks)
    assert plan.position == 26 and plan.tier == "disk"
    s.delete(plan.blocks[3].key.hex())                   # "evicted" after the plan was made
    restored = s.load(plan)
    assert not restored.ok and restored.dropped == 0     # gone, not corrupt
    assert restored.position == 12                       # the good blocks: 0..2
    # planned again below it (as the cache manager does): a hybrid falls back to its
    # snapshot at 9, attention to the good blocks
    again = s.load(s.lookup(toks, max_tokens=restored.position))
    assert again.ok and again.position == (9 if spec.is_hybrid else 12)
    check_restored(spec, again, toks)
    st = s.stats()
    assert st["missing"] >= 1 and st["corrupt_dropped"] == 0


def test_child_committed_after_its_parent_was_deleted(open_store):
    spec = attention_spec()
    s = open_store(spec, host_budget=0)
    toks = list(range(6 * B))
    s.put_blocks(toks, 0, fake_pages(spec, toks, 0, 4))
    s.flush()
    s.delete(s.lookup(toks).blocks[2].key.hex())         # blocks 2, 3 go
    s.put_blocks(toks, 4, fake_pages(spec, toks, 4, 2))  # children of the deleted block 3
    s.flush()
    assert s.stats()["disk"]["entries"] == 2             # skipped: no block without its parent
    assert s.verify().orphans == [] and s.lookup(toks).position == 2 * B


def test_same_block_put_from_two_threads_is_stored_once(open_store):
    spec = attention_spec()
    s = open_store(spec, host_budget=0)
    toks = list(range(64 * B))
    pages = fake_pages(spec, toks, 0, 64)
    barrier = threading.Barrier(2)

    def put():
        barrier.wait()
        s.put_blocks(toks, 0, pages)
    threads = [threading.Thread(target=put) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.flush()
    stored = sum(m.stored_bytes for _, m in s.disk.scan())
    assert len(s.disk.scan()) == 64 and s.catalog.index.stored_bytes == stored


def test_threads_put_lookup_and_load_under_a_tight_budget(open_store):
    spec = hybrid_spec(torch.float32)
    s = open_store(spec, disk_budget=60_000, host_budget=20_000, batch=4)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(40):
                toks = [rng.randrange(3) for _ in range(rng.randrange(1, 20))]
                if rng.random() < 0.5:
                    fill(s, spec, toks)
                else:
                    plan = s.lookup(toks + [7], max_tokens=len(toks))
                    restored = s.load(plan)
                    check_restored(spec, restored, toks)      # whatever came back is right
        except BaseException as e:       # noqa: BLE001  (re-raised in the main thread)
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    s.flush()
    assert s.stats()["disk"]["stored_bytes"] <= 60_000
    report = s.verify()
    assert report.bad == [] and report.orphans == []
    assert s.catalog.index.stored_bytes == sum(m.stored_bytes for _, m in s.disk.scan())
    assert FP in s.stats()["disk"]["by_fingerprint"]


def test_a_block_dropped_before_its_promotion_stays_dropped(open_store):
    # Restored blocks are copied into RAM after the restore returns: a removal that
    # lands in between (here the corrupt-value path, which does not wait for pending
    # promotions the way delete() and clear() do) must not see them come back.
    spec = attention_spec()
    toks = list(range(5 * B))
    s = open_store(spec)
    s.put_blocks(toks, 0, fake_pages(spec, toks, 0, 5))
    s.close()
    s = open_store(spec)                                # a restart: the blocks are on disk
    check_restored(spec, s.load(s.lookup(toks)), toks)  # a first read: not promoted
    s.flush()
    gate = threading.Event()
    s.reader.promoter.submit(gate.wait)                        # hold the promoter
    plan = s.lookup(toks)
    assert plan.tier == "disk"
    check_restored(spec, s.load(plan), toks)
    gone = [b.key for b in plan.blocks[2:]]
    s.reader.drop(gone)
    gate.set()
    s.flush()
    assert all(s.host.get(b.key) is not None for b in plan.blocks[:2])   # promoted
    assert all(s.host.get(k) is None for k in gone)
    assert s.lookup(toks).position == 2 * B

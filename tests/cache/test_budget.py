"""Budgets: LRU leaves go first, pinned entries stay, the disk budget is never passed,
and a full LMDB map or a full write queue is survived and counted."""

from __future__ import annotations

import time

import torch

from ckptd.cache import codec
from ckptd.cache.store.admin import VerifyReport
from ckptd.model.spec import AttentionSpec, StateSpec
from tests.cache.conftest import FP, B, attention_spec, fake_pages, fill, hybrid_spec


def _block_bytes(spec) -> int:
    return len(codec.encode({"kv": fake_pages(spec, list(range(B)), 0, 1)[0]}, FP))


def _closed(store) -> bool:
    rows = store.catalog.index.rows
    return all(not m.has_block_parent or m.parent in rows for m in rows.values())


def test_budget_evicts_lru_leaves_and_keeps_pinned(open_store):
    spec = attention_spec(torch.float32)
    budget = 40 * _block_bytes(spec) + 2000
    s = open_store(spec, disk_budget=budget, host_budget=0, batch=8)
    pinned = list(range(1000, 1000 + 8 * B))
    fill(s, spec, pinned)
    s.flush()
    key = s.lookup(pinned, max_tokens=8 * B - 1).blocks[-1].key     # the 7th block
    assert s.pin(key.hex()) == 7                        # it and its 6 ancestors
    for i in range(20):
        fill(s, spec, [i] * (4 * B) + [i + 1])          # 4 blocks + a snapshot each
        s.flush()
        assert s.stats()["disk"]["stored_bytes"] <= budget
        assert _closed(s)
    assert s.lookup(pinned).position >= 7 * B
    assert s.lookup([19] * (4 * B) + [20]).position == 4 * B + 1      # the newest stays
    assert s.lookup([0] * (4 * B) + [1]).position == 0                # the oldest went
    assert s.stats()["evictions"] > 0
    assert s.verify().orphans == []


def test_hybrid_evicts_blocks_without_snapshot_first(open_store):
    spec = hybrid_spec(torch.float32)
    s = open_store(spec, host_budget=0)
    a = [1] * (4 * B) + [2]
    fill(s, spec, a)                                    # older, restorable (has a snapshot)
    s.flush()
    b = [3] * (4 * B)
    s.put_blocks(b, 0, fake_pages(spec, b, 0, 4))       # newer, but no snapshot: useless
    s.flush()
    stored = s.stats()["disk"]["stored_bytes"]
    s.close()
    s = open_store(spec, disk_budget=stored - 1, host_budget=0)   # one entry must go
    fill(s, spec, [7])                                  # a small snapshot triggers eviction
    s.flush()
    assert s.lookup(a).position == 4 * B + 1            # the older snapshot survived
    assert s.stats()["disk"]["stored_bytes"] <= stored - 1


def test_pinned_entries_filling_the_budget_turn_writes_away(open_store):
    spec = attention_spec(torch.float32)
    keep, more = list(range(5 * B)), [9] * (4 * B)
    s = open_store(spec, host_budget=0)
    s.put_blocks(keep, 0, fake_pages(spec, keep, 0, 5))
    s.flush()
    s.pin(s.lookup(keep).blocks[-1].key.hex())
    pinned = s.stats()["disk"]["stored_bytes"]
    s.close()
    sizes = [len(codec.encode({"kv": p}, FP)) for p in fake_pages(spec, more, 0, 2)]
    budget = pinned + sizes[0] + sizes[1] // 2          # room for exactly one more block
    s = open_store(spec, disk_budget=budget, host_budget=0)
    s.put_blocks(more, 0, fake_pages(spec, more, 0, 4))
    s.flush()
    st = s.stats()
    assert st["disk"]["stored_bytes"] <= budget
    assert st["write_queue"]["lost_no_room"] >= 1
    assert s.lookup(keep).position == 5 * B and s.lookup(more).position <= B


def test_full_lmdb_map_is_survived(open_store, tmp_path):
    spec = StateSpec(B, AttentionSpec(4, 4, 32, torch.float32), None)      # 16 KiB pages
    s = open_store(spec, map_bytes=1 << 20, host_budget=0, batch=16)
    assert s.budget <= (1 << 20) * 2 // 3               # a small map caps the budget...
    s.budget = 1 << 30                                  # ...force it off: the map must fill
    for i in range(8):
        toks = [i] * (40 * B)
        s.put_blocks(toks, 0, fake_pages(spec, toks, 0, 40))
        s.flush()
    st = s.stats()
    assert st["write_queue"]["map_full"] > 0
    assert s.verify() == VerifyReport(st["disk"]["entries"], [], [], 0)   # all whole
    for key in [e.key for e in s.entries(limit=5)]:
        info = s.get_info(key)
        toks = [info.tokens[0]] * info.position
        assert s.load(s.lookup(toks)).ok                # still serving
    s.close()
    s = open_store(spec, map_bytes=1 << 20, host_budget=0)     # a restart gives headroom
    toks = [77] * B
    s.put_blocks(toks, 0, fake_pages(spec, toks, 0, 1))
    s.flush()
    assert s.lookup(toks).position == B


def test_full_queue_drops_or_blocks_per_flag(open_store, tmp_path):
    spec = attention_spec(torch.float32)
    toks = list(range(200 * B))
    pages = fake_pages(spec, toks, 0, 200)
    page = pages[0].numel() * 4
    drop = open_store(spec, path=tmp_path / "drop", queue_bytes=2 * page, host_budget=0)
    drop.put_blocks(toks, 0, pages)
    drop.flush()
    st = drop.stats()["write_queue"]
    assert st["dropped"] > 0 and st["committed"] + st["dropped"] == 200
    block = open_store(spec, path=tmp_path / "block", queue_bytes=2 * page, host_budget=0,
                       block_when_full=True)
    assert block.put_blocks(toks, 0, pages) == 200
    block.flush()
    assert block.stats()["write_queue"]["dropped"] == 0
    assert block.lookup(toks).position == 200 * B


def test_a_batch_over_the_budget_keeps_its_newest_prompt(open_store, tmp_path):
    """Writes that waited (here: the LMDB writer lock held by another process's
    transaction) come as one batch holding several prompts; when it can't all fit,
    the newest prompt is the one kept whole, as eviction would have kept it."""
    spec = attention_spec(torch.float32)
    prompts = [[i] * (4 * B) + [i + 1] for i in range(3)]
    probe = open_store(spec, path=tmp_path / "probe", host_budget=0)
    fill(probe, spec, prompts[0])
    probe.flush()
    one = probe.stats()["disk"]["stored_bytes"]
    s = open_store(spec, disk_budget=one * 3 // 2, host_budget=0, batch=64)
    held = s.disk.env.begin(write=True)
    try:
        # The writer takes a first, unrelated entry and waits for the lock with it; what
        # comes after queues up behind it and is then taken as one batch.
        fill(s, spec, [99])
        deadline = time.monotonic() + 30
        while s.writer.queue and time.monotonic() < deadline:
            time.sleep(0.01)
        for p in prompts:
            fill(s, spec, p)
    finally:
        held.abort()
    s.flush()
    assert s.lookup(prompts[-1]).position == len(prompts[-1])
    assert s.stats()["disk"]["stored_bytes"] <= one * 3 // 2
    assert _closed(s)

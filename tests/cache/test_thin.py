"""Snapshot thinning (dense near a prefix's end, bounded, pinned kept) and plans over
blocks the caller holds on its device."""

from __future__ import annotations

import pytest
import torch

from ckptd.cache.entry import BRANCH, END, INTERVAL, SNAPSHOT, TAIL, TAIL_WINDOW, EntryMeta
from ckptd.cache.keys import block_keys
from ckptd.cache.lookup import DEVICE
from ckptd.cache.store.thin import Forget, replaced_tails, split_forgets, thin_victims
from tests.cache.conftest import (
    B,
    attention_spec,
    check_restored,
    fake_pages,
    fake_snapshot,
    fill,
    hybrid_spec,
)


def test_thin_victims_spaces_survivors_geometrically():
    kept = []
    for end in range(1, 65):             # a snapshot per interval, thinned as they come
        kept = sorted(set(kept) - set(thin_victims(kept, end, 8))) + [end]
    assert kept == [32, 48, 56, 60, 61, 62, 63, 64]
    gaps = [b - a for a, b in zip(kept, kept[1:])]
    assert gaps == sorted(gaps, reverse=True)
    assert thin_victims([1, 2, 3], 4, 4) == [] and thin_victims([], 9, 1) == []
    victims = thin_victims(range(1, 20), 20, 3, pinned={2, 5, 7})
    assert set(range(1, 20)) - set(victims) == {2, 5, 7}        # pinned stay, even past 3


def test_thin_victims_keeps_a_snapshot_restores_used():
    kept = []
    for end in range(1, 65):
        kept = sorted(set(kept) - set(thin_victims(kept, end, 8, hits={5: 3}))) + [end]
    assert 5 in kept and len(kept) == 8          # the branch point stays, the bound holds
    plain = thin_victims(list(range(1, 20)), 20, 4)
    assert 5 in plain and 5 not in thin_victims(list(range(1, 20)), 20, 4, hits={5: 100})


def test_stale_tails_go_first_and_firm_snapshots_last():
    positions = list(range(1, 20))
    plain = thin_victims(positions, 20, 10)
    stale = {2, 3}                                 # tails the path's end has moved past
    got = thin_victims(positions, 20, 10, stale=stale)
    assert set(got[:2]) == stale and 1 in plain[:2]
    assert len(got) == len(plain)
    firm = set(range(1, 20)) - {18}
    assert thin_victims(positions, 20, 10, firm=firm)[0] == 18   # the one not firm first


def test_a_branch_point_replaces_the_tails_just_below_it():
    def meta(p, role, pinned=False):
        return EntryMeta(SNAPSHOT, bytes(16), p, [], "fp", role=role, pinned=pinned)
    branch = 5000
    found = {branch - 40: meta(branch - 40, TAIL), branch - 232: meta(branch - 232, TAIL),
             branch - TAIL_WINDOW: meta(branch - TAIL_WINDOW, TAIL),
             branch - TAIL_WINDOW - 1: meta(branch - TAIL_WINDOW - 1, TAIL),   # too far
             branch - 100: meta(branch - 100, TAIL, pinned=True),             # pinned
             branch - 300: meta(branch - 300, INTERVAL), branch - 10: meta(branch - 10, END),
             branch + 30: meta(branch + 30, TAIL)}                           # above it
    assert replaced_tails(found, branch) == [branch - TAIL_WINDOW, branch - 232, branch - 40]


def test_split_forgets_keeps_order():
    put = [(b"a", None, b""), (b"b", None, b"")]
    puts, gone = split_forgets([put[0], Forget((b"a", b"c")), put[1], Forget((b"b",)), put[1]])
    assert puts == [put[1]] and gone == {b"a", b"b", b"c"}       # a put after its forget stays


def _path(store, tokens) -> list[int]:
    """Positions of the snapshots of prefixes of tokens."""
    parents = [store.root(None), *block_keys(store.root(None), tokens, B)]
    return sorted(e.position for e in store.entries(limit=10_000, kind="snapshot")
                  if e.position <= len(tokens)
                  and e.parent == parents[(e.position - len(e.tokens)) // B].hex()
                  and e.tokens == tokens[e.position - len(e.tokens):e.position])


def test_put_snapshot_thins_its_path_in_every_tier(open_store, tmp_path):
    spec = hybrid_spec()
    tokens = list(range(100, 100 + 40 * B))
    other = tokens[:10 * B] + [7] * (2 * B)                         # a branch off the path
    s = open_store(spec)
    s.put_blocks(tokens, 0, fake_pages(spec, tokens, 0, 40))
    fill(s, spec, other)
    s.flush()
    pinned_at = 6 * B
    for i in range(1, 41):
        s.put_snapshot(tokens[:i * B], fake_snapshot(spec, tokens[:i * B]), keep=5)
        if i * B == pinned_at:
            s.flush()
            assert s.pin(s.lookup(tokens[:pinned_at]).snapshot.key.hex()) > 0
    s.put_snapshot(tokens + [1], fake_snapshot(spec, tokens + [1]), keep=5)
    kept = _path(s, tokens + [1])
    assert len(kept) == 5 and pinned_at in kept and kept[-2:] == [40 * B, 40 * B + 1]
    gaps = [b - a for a, b in zip(kept, kept[1:])]
    assert gaps == sorted(gaps, reverse=True)
    assert _path(s, other) == [pinned_at, len(other)]              # the branch keeps its own
    assert s.stats()["snapshots_thinned"] == 41 - 5
    s.close()
    s = open_store(spec, host_budget=0)                             # and so does the disk
    assert _path(s, tokens + [1]) == kept
    plan = s.lookup(tokens[:33 * B] + [5])                          # restores from a survivor
    assert plan.position == max(p for p in kept if p <= 33 * B)
    check_restored(spec, s.load(plan), tokens)
    with pytest.raises(ValueError):
        s.put_snapshot(tokens[:B], fake_snapshot(spec, tokens[:B]), keep=0)


def test_a_snapshot_restores_use_outlives_thinning(open_store):
    spec = hybrid_spec()
    tokens = list(range(100, 100 + 40 * B))
    s = open_store(spec)
    s.put_blocks(tokens, 0, fake_pages(spec, tokens, 0, 40))
    for i in range(1, 41):
        s.put_snapshot(tokens[:i * B], fake_snapshot(spec, tokens[:i * B]), keep=5)
        if i == 12:                       # four questions leave the path here
            s.flush()
            for q in range(4):
                plan = s.lookup(tokens[:12 * B] + [3 + q])
                assert plan.position == 12 * B and s.load(plan).ok
    assert 12 * B in _path(s, tokens) and len(_path(s, tokens)) == 5


def test_forget_of_a_queued_snapshot_never_reaches_disk(open_store):
    spec = hybrid_spec()
    tokens = list(range(50, 50 + 3 * B))
    s = open_store(spec, host_budget=0)
    s.put_blocks(tokens, 0, fake_pages(spec, tokens, 0, 3))
    key = s.put_snapshot(tokens[:2 * B], fake_snapshot(spec, tokens[:2 * B]))
    assert s.forget([key]) == 1
    s.flush()
    assert s.get_info(key.hex()) is None and s.lookup(tokens).position == 0
    assert s.stats()["write_queue"]["committed"] == 4               # three blocks, one snapshot


@pytest.mark.parametrize("hybrid", [True, False])
def test_plan_over_device_blocks(open_store, hybrid):
    spec = hybrid_spec() if hybrid else attention_spec()
    tokens = list(range(200, 200 + 6 * B + 2))
    s = open_store(spec)
    fill(s, spec, tokens)
    plan = s.lookup(tokens, device_blocks=4)
    assert plan.position == len(tokens) and plan.device_blocks == 4
    assert [p.tier for p in plan.blocks] == ["host"] * 2      # device blocks aren't listed
    assert plan.tier == "host" and plan.bytes_by_tier() == {"host": plan.total_bytes}
    restored = s.load(plan)
    assert restored.ok and restored.first_block == 4 and restored.pages.shape[0] == 2
    assert torch.equal(restored.pages, fake_pages(spec, tokens, 4, 2))

    # Blocks only the device holds still lead to what the store has after them.
    s.delete(s.chain(tokens).keys[0].hex())                         # everything below goes
    fill(s, spec, tokens[:3 * B])
    lost = s.lookup(tokens + [1], device_blocks=6)
    if hybrid:      # no snapshot at or below the device blocks' end but the one at 3 B
        assert lost.position == 3 * B and lost.device_blocks == 3
    else:           # the device blocks alone: nothing to read
        assert lost.position == 6 * B and lost.tier == DEVICE and lost.bytes_by_tier() == {}
        got = s.load(lost)
        assert got.ok and got.pages is None and got.tier == DEVICE and got.first_block == 6


def _roles(store) -> dict[int, str]:
    return {e.position: e.role for e in store.entries(limit=10_000, kind="snapshot")}


def test_a_stored_branch_point_drops_the_tails_it_replaces(open_store):
    """A raw prompt's tails are written through every tier; the branch point the next
    question leaves at the document's end drops them (from RAM and disk), and a plan
    restores from the branch point."""
    spec = hybrid_spec()
    doc = list(range(100, 100 + 300 * B))
    first = doc + [7] * 6                              # the document, then a question
    s = open_store(spec)
    s.put_blocks(first, 0, fake_pages(spec, first, 0, len(first) // B))
    tails = [len(first) - o for o in (64, 256, 1024)]
    for p in tails:
        s.put_snapshot(first[:p], fake_snapshot(spec, first[:p]), keep=16, role=TAIL)
    s.put_snapshot(first, fake_snapshot(spec, first), keep=16, role=END)
    s.flush()
    assert {p: r for p, r in _roles(s).items() if r == TAIL} == dict.fromkeys(tails, TAIL)
    second = doc + [9] * 5
    assert s.lookup(second).position == tails[0]       # the nearest tail serves it
    s.put_snapshot(doc, fake_snapshot(spec, doc), keep=16, role=BRANCH)
    s.flush()
    assert _roles(s) == {len(doc): BRANCH, len(first): END}
    assert s.stats()["snapshots_thinned"] == 3
    s.close()
    s = open_store(spec, host_budget=0)                # gone from the disk too
    assert _roles(s) == {len(doc): BRANCH, len(first): END}
    plan = s.lookup(second)
    assert plan.position == len(doc)
    check_restored(spec, s.load(plan), second)

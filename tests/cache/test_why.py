"""Why a restore stopped where it did (cache/why/): the explanation over a real store and
its records of departed entries, the records themselves (bounded, per key, saved),
and a report explained when read, as of its restore."""

from __future__ import annotations

import time

from ckptd.cache.entry import BLOCK, SNAPSHOT, EntryMeta
from ckptd.cache.why.explain import Attempt, Failed, explain
from ckptd.cache.why.gone import BUDGET, EVICTED, HISTORY, Gone
from ckptd.cache.why.ledger import Ledger
from tests.cache.conftest import FP, B, attention_spec, fill, hybrid_spec


def _why(store, tokens, attempt, salt=None, salts=None):
    chain = store.chain(tokens, salt)
    return explain(tokens, chain, attempt, store.catalog, store.gone,
                   salts if salts is not None else {chain.root: salt}, FP)


def test_a_miss_is_explained_as_of_its_restore(open_store):
    s = open_store(attention_spec())
    tokens = list(range(3 * B + 2))
    fill(s, attention_spec(), tokens)
    before = time.time()
    time.sleep(0.01)
    first = s.lookup(tokens).blocks[0].key.hex()
    assert s.delete(first) > 0
    after = time.time()
    assert _why(s, tokens, Attempt(0, at=before)).reason == "unseen"
    miss = _why(s, tokens, Attempt(0, at=after))
    assert miss.reason == "deleted" and miss.position == 0 and 0 <= miss.ago < 5


def test_a_failed_load_says_which_tier_and_what_it_cost(open_store):
    s = open_store(hybrid_spec())
    tokens = list(range(30))
    fill(s, hybrid_spec(), tokens)
    miss = _why(s, tokens + [99], Attempt(8, 30, failed=Failed(30, "tier_fault", "remote")))
    assert (miss.reason, miss.tier, miss.recomputed, miss.position) == \
        ("tier_fault", "remote", 22, 8)
    assert "remote tier could not serve" in miss.detail
    assert _why(s, tokens, Attempt(29, 30)) is None          # all but the last token


def test_a_short_prompt_cached_under_another_salt(open_store):
    s = open_store(hybrid_spec())
    short = [7, 8, 9]                    # shorter than a block: a snapshot, found by a scan
    fill(s, hybrid_spec(), short, salt="alice")
    s.flush()                                # roots are read from the disk index
    alice = s.chain(short, "alice").root
    miss = _why(s, short, Attempt(0), salt="bob",
                salts={alice: "alice", s.chain([], "bob").root: "bob"})
    assert miss.reason == "other_salt" and "another cache salt" in miss.detail
    adapters = b"\xfflora\x00" + bytes(16)
    miss = _why(s, short, Attempt(0), salt=adapters,
                salts={alice: "alice", s.chain([], adapters).root: adapters})
    assert miss.reason == "other_adapters"
    # a root this process never saw a request for: either
    miss = _why(s, short, Attempt(0), salt="bob", salts={})
    assert miss.reason == "other_salt" and "salt or LoRA adapter set" in miss.detail


def _meta(kind: str, position: int, parent: bytes = b"p" * 16) -> EntryMeta:
    return EntryMeta(kind, parent, position, [1] * (position % B or B), FP)


def test_departures_are_bounded_kept_per_key_and_saved(tmp_path):
    gone = Gone(limit=3)
    for i in range(5):
        gone.left([(bytes([i]) * 16, _meta(SNAPSHOT, 5))], EVICTED, "disk")
    assert len(gone) == 3 and gone.get(bytes([0]) * 16) is None
    assert len(gone.snapshots_after(b"p" * 16)) == 3
    key = bytes([4]) * 16
    for _ in range(HISTORY + 2):
        gone.left([(key, _meta(SNAPSHOT, 5))], EVICTED, "host")
    assert len(gone.records[key]) == HISTORY
    first = gone.records[key][0]
    assert gone.get(key, first.at) == first and gone.get(key, first.at - 1) is None
    # a host eviction does not hide that a budget refused the write first
    gone.left([(b"b" * 16, _meta(BLOCK, B))], BUDGET, "disk", "no room")
    gone.left([(b"b" * 16, _meta(BLOCK, B))], EVICTED, "host", unless=BUDGET)
    assert gone.get(b"b" * 16).reason == BUDGET
    gone.save(tmp_path)
    back = Gone.load(tmp_path, limit=3)
    assert {k: v for k, v in back.records.items()} == dict(gone.records)
    assert not back.changed and back.snapshots_after(b"p" * 16)
    (tmp_path / "gone.json").write_text("{not json")
    assert len(Gone.load(tmp_path)) == 0                      # a bad file: none, no error


def test_device_departures_are_recorded_in_order_when_next_read(tmp_path):
    gone = Gone()
    a, b = b"a" * 16, b"b" * 16
    gone.blocks_left([(a, None, B), (b, a, 2 * B)], EVICTED, "device", "reclaimed")
    assert gone.pending                        # the reclaim paid an append
    gone.left([(a, _meta(BLOCK, B))], EVICTED, "host")          # later: recorded after it
    assert [r.tier for r in gone.records[a]] == ["device", "host"] and not gone.pending
    assert gone.get(b).position == 2 * B and gone.get(b).tier == "device"
    assert gone.earlier(a, gone.get(a)).tier == "device"
    gone.blocks_left([(b"c" * 16, b, 3 * B)], BUDGET, "device", "x", unless=BUDGET)
    gone.save(tmp_path)                        # what waits is saved too
    assert Gone.load(tmp_path).get(b"c" * 16).reason == BUDGET


def test_a_report_is_explained_once_when_read(open_store):
    s = open_store(attention_spec())
    tokens = list(range(2 * B + 3))
    ledger = Ledger(s.catalog, s.gone, FP)
    chain = s.chain(tokens)
    rep = ledger.report(1, tokens, None, chain, Attempt(0), [], 0.1)
    assert rep.pending is not None and ledger.misses == {}   # filed, not yet explained
    assert rep.miss.reason == "unseen" and rep.pending is None
    assert ledger.stats()["by_reason"]["unseen"] == 1
    assert rep.to_dict()["miss"]["reason"] == "unseen"       # counted once
    assert ledger.stats()["by_reason"]["unseen"] == 1
    tokens.append(5)                     # the sequence's list grows with its answer
    full = ledger.report(2, tokens, None, chain, Attempt(len(tokens) - 1), [], 0.1)
    assert full.miss is None and ledger.stats()["complete"] == 1


def test_the_last_tier_to_let_an_entry_go_is_the_one_reported(open_store):
    spec = attention_spec()
    s = open_store(spec)
    a = list(range(2 * B))
    fill(s, spec, a)
    s.flush()
    s.evict_to(0, hybrid=False)                   # off the disk: RAM still holds it
    block = s.chain(a).keys[0]
    assert s.gone.get(block).tier == "disk" and s.host.contains(block)
    s.host.budget = s.host.bytes                  # RAM full: the next put evicts a's
    fill(s, spec, list(range(100, 100 + 2 * B)))
    assert not s.host.contains(block)
    miss = _why(s, a + [1], Attempt(0))
    assert (miss.reason, miss.tier) == ("evicted", "host")
    assert "evicted from host" in miss.detail

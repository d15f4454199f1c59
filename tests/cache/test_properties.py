"""Lookup against a model of what was stored: the longest restorable prefix, never more,
never another tenant's or model's entry; and what loads is exactly that prefix's state."""

from __future__ import annotations

import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptd.cache.store.store import CacheStore
from tests.cache.conftest import (
    FP,
    B,
    attention_spec,
    check_restored,
    fill,
    hybrid_spec,
    recurrent_spec,
)

prompts = st.lists(st.integers(0, 2), min_size=1, max_size=22)    # small alphabet: shared prefixes
salted = st.tuples(prompts, st.sampled_from(["", "a"]))


def restorable(stored: list[tuple[list[int], str]], query: list[int], salt: str, limit: int,
               hybrid: bool) -> int:
    """The model: each prompt left all its blocks and a snapshot at its end. A hybrid
    restores only at a snapshot; attention KV can be cut anywhere inside what a
    stored prompt covers."""
    best = 0
    for toks, s in stored:
        if s != salt:
            continue
        common = 0
        while common < min(len(toks), len(query)) and toks[common] == query[common]:
            common += 1
        if not hybrid:
            best = max(best, min(common, limit))
        elif common == len(toks) <= limit:
            best = max(best, len(toks))
    return best


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["hybrid", "attention", "recurrent"]), via_disk=st.booleans(),
       stored=st.lists(salted, min_size=1, max_size=6),
       queries=st.lists(st.tuples(salted, st.integers(0, 4)), max_size=6))
def test_lookup_is_the_longest_restorable_prefix(kind, via_disk, stored, queries):
    spec = {"hybrid": hybrid_spec, "attention": attention_spec, "recurrent": recurrent_spec}[kind]()
    hybrid = kind != "attention"
    with tempfile.TemporaryDirectory() as d:
        s = CacheStore(d, spec, FP, host_budget=0 if via_disk else 1 << 20)
        for toks, salt in stored:
            fill(s, spec, toks, salt=salt or None)
        s.flush()
        asks = [((t, salt), cut) for t, salt in stored for cut in range(B + 1)] + queries
        for (toks, salt), cut in asks:
            query = toks + [9]                       # 9 is never stored: one token to compute
            limit = max(0, len(query) - 1 - cut)
            plan = s.lookup(query, salt=salt or None, max_tokens=limit)
            assert plan.position == restorable(stored, query, salt, limit, hybrid), \
                (query, salt, limit)
            restored = s.load(plan)
            assert restored.ok and restored.position == plan.position
            check_restored(spec, restored, query)
        s.close()
        other = CacheStore(d, spec, "other-model")   # same path, another model: nothing
        for toks, salt in stored:
            assert other.lookup(toks, salt=salt or None).position == 0
        other.close()

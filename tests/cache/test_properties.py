"""Lookup against a model of what was stored: longest restorable prefix, never more."""

from __future__ import annotations

import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache.store import CacheStore
from tests.cache.conftest import B, attention_spec, fake_pages, fake_snapshot, hybrid_spec

prompts = st.lists(st.integers(0, 3), min_size=1, max_size=26)     # small alphabet: shared prefixes
salted = st.tuples(prompts, st.sampled_from(["", "a"]))


def _common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def expected(stored: list[tuple[list[int], str]], query: list[int], salt: str, hybrid: bool):
    """What a perfect lookup returns; every stored prompt has its blocks and a snapshot at
    its end; at least one query token is left to compute."""
    limit = len(query) - 1
    mine = [(t, _common(t, query)) for t, s in stored if s == salt]
    if hybrid:      # only a snapshot fully matched within the limit is restorable
        return max([len(t) for t, c in mine if c == len(t) and len(t) <= limit], default=0)
    # attention only: the deepest matching block, then any snapshot after that block can
    # lend the matching part of its partial page (KV can be cut anywhere)
    depth = max([min(c, len(t), limit) // B for t, c in mine], default=0)
    best = depth * B
    for t, c in mine:
        if len(t) // B == depth and c >= depth * B:
            best = max(best, min(c, len(t), limit))
    return best


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans(), st.lists(salted, min_size=1, max_size=6),
       st.lists(salted, min_size=1, max_size=6))
def test_lookup_is_longest_restorable_prefix(hybrid, stored, queries):
    spec = hybrid_spec() if hybrid else attention_spec()
    with tempfile.TemporaryDirectory() as d:
        s = CacheStore(d, spec, "fp")
        for toks, salt in stored:
            n = len(toks) // B
            if n:
                s.put_blocks(toks, 0, fake_pages(spec, toks, 0, n), salt=salt or None)
            s.put_snapshot(toks, fake_snapshot(spec, toks), salt=salt or None)
        for toks, salt in queries + stored:
            query = toks + [9]
            plan = s.lookup(query, salt=salt or None, max_tokens=len(query) - 1)
            assert plan.position == expected(stored, query, salt, hybrid), (query, salt)
            restored = s.load(plan)
            assert restored.ok
            if plan.position // B:
                assert (restored.pages == fake_pages(spec, query, 0, plan.position // B)).all()
        s.close()
        # another model opening the same store never finds this model's entries
        other = CacheStore(d, spec, "other-model")
        for toks, salt in stored:
            assert other.lookup(toks + [9], salt=salt or None).position == 0
        other.close()

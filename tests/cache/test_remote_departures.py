"""What the remote tier loses, as one daemon sees it (cache/remote/lost.py), against a real
S3 server (SeaweedFS): a restore that finds a segment corrupt or gone fails from the
remote, and a later request for that prefix is told the remote lost it (and when), not
that it was never seen; a state head found bad the same."""

from __future__ import annotations

import pytest

from ckptd.cache.lookup import REMOTE
from ckptd.cache.restorer import _failed
from ckptd.cache.why.explain import Attempt, explain
from tests.cache.conftest import FP
from tests.cache.test_remote import (
    TOKENS,
    aws,  # noqa: F401  (the fixture: AWS_* point at SeaweedFS)
    remote,
    uploaded,
)
from tests.remote_damage import flip_block
from tests.s3 import BUCKET, fresh_url

B = 4        # tests/cache/conftest.py's block size: TOKENS is 20 blocks and 2 tokens
pytestmark = pytest.mark.usefixtures("aws")


def _patient(spec, url):
    """The remote tier as a daemon has it, with a lookup that outlasts a loaded machine
    (a lookup that times out finds nothing, and loses nothing)."""
    return remote(spec, url, lookup_timeout=30.0)


def _restore(store, tokens):
    """A restore as the restorer makes it: the plan with the remote's pieces, loaded;
    what the request is told (its own failure)."""
    chain = store.chain(tokens)
    plan = store.lookup_remote(tokens, len(tokens), chain)
    restored = store.load(plan)
    seen = Attempt(0 if not restored.ok else restored.position, plan.shared)
    if not restored.ok:
        seen.failed = _failed(plan, restored, B)
    assert store.flush(30)
    return explain(tokens, chain, seen, store.catalog, store.gone, {chain.root: None}, FP)


def _later(store, tokens):
    """A later request's miss: what the local tiers restore now, and why not more."""
    chain = store.chain(tokens)
    plan = store.lookup(tokens, max_tokens=len(tokens) - 1, chain=chain)
    return explain(tokens, chain, Attempt(plan.position, plan.shared), store.catalog,
                   store.gone, {chain.root: None}, FP)


def test_a_corrupt_segment_fails_the_restore_and_is_reported_lost_after(
        open_store, spec, tmp_path, s3_server):
    url = fresh_url()
    a = uploaded(open_store, spec, url, tmp_path / "a")
    chain = a.chain(TOKENS)
    s3 = s3_server.client()
    bad = a.remote.layout.segment(chain.keys[7], chain.keys[15])      # blocks 8-15
    body = bytearray(s3.get_object(Bucket=BUCKET, Key=bad)["Body"].read())
    assert flip_block(body, 2) == 2                  # block 10's frame: blocks 10-11
    s3.put_object(Bucket=BUCKET, Key=bad, Body=bytes(body))
    b = open_store(spec, path=tmp_path / "b", remote=_patient(spec, url))
    miss = _restore(b, TOKENS)
    assert (miss.reason, miss.tier, miss.position) == ("corrupt", REMOTE, 0)
    # blocks 0-9 were kept; the remote lost the rest of that segment and the state
    miss = _later(b, TOKENS)
    assert (miss.reason, miss.tier) == ("corrupt", REMOTE), miss
    assert 0 <= miss.ago < 60 and "held a corrupt value" in miss.detail
    if spec.is_hybrid:         # no snapshot over blocks 0-9: the state at the end is it
        assert miss.position == 0 and miss.recomputed == len(TOKENS)
        assert f"the remote state at {len(TOKENS)}" in miss.detail
    else:
        assert miss.position == 10 * B and "the block at 44" in miss.detail


def test_a_segment_gone_from_the_bucket_is_evicted_from_the_remote(
        open_store, spec, tmp_path, s3_server):
    url = fresh_url()
    a = uploaded(open_store, spec, url, tmp_path / "a")
    chain = a.chain(TOKENS)
    # what gc on another machine does: this daemon learns of it when it reads it
    s3_server.client().delete_object(
        Bucket=BUCKET, Key=a.remote.layout.segment(chain.keys[15], chain.keys[19]))
    b = open_store(spec, path=tmp_path / "b", remote=_patient(spec, url))
    miss = _restore(b, TOKENS)
    assert (miss.reason, miss.tier) == ("tier_fault", REMOTE)
    assert "remote tier could not serve" in miss.detail
    miss = _later(b, TOKENS)
    assert (miss.reason, miss.tier) == ("evicted", REMOTE), miss
    assert "evicted from remote" in miss.detail and "gone from the bucket" in miss.detail
    assert miss.position == (0 if spec.is_hybrid else 16 * B)


def test_a_state_head_found_bad_is_reported_dropped_from_the_remote(
        open_store, spec, tmp_path, s3_server):
    url = fresh_url()
    a = uploaded(open_store, spec, url, tmp_path / "a")
    chain = a.chain(TOKENS)
    (_, _, name), = a.remote.states()
    s3 = s3_server.client()
    body = bytearray(s3.get_object(Bucket=BUCKET, Key=name)["Body"].read())
    body[12] ^= 0x01                       # inside the head: its checksum fails
    s3.put_object(Bucket=BUCKET, Key=name, Body=bytes(body))
    b = open_store(spec, path=tmp_path / "b", remote=_patient(spec, url))
    assert b.lookup_remote(TOKENS, len(TOKENS), chain).position == 0
    assert not b.remote.states()                    # deleted: it is the index of nothing
    miss = _later(b, TOKENS)
    assert (miss.reason, miss.tier, miss.position) == ("corrupt", REMOTE, 0), miss
    assert "head failed verification" in miss.detail
    assert f"the remote state at {len(TOKENS)}" in miss.detail

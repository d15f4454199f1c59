"""The one parent -> children bookkeeping (cache/children.py) the host tier, the disk
index and the device's prefix table keep."""

from __future__ import annotations

import pytest

from ckptd.cache.children import Children


def test_children_and_snapshots_follow_adds_and_removes():
    c = Children()
    c.add(b"b1", b"root")
    c.add(b"s1", b"root", snapshot=True)
    c.add(b"b2", b"b1")
    c.add(b"first", None)                      # a first block on the device: no parent
    assert c.of(b"root") == {b"b1", b"s1"} and c.of(b"b2") == ()
    assert c.counts() == {b"root": 2, b"b1": 1}
    assert c.has_snapshots(b"root") and not c.has_snapshots(b"b1")
    assert c.with_snapshots([b"b1", b"root", b"none"]) == {b"root"}
    c.remove(b"s1", b"root", snapshot=True)
    c.remove(b"b2", b"b1")
    assert c.counts() == {b"root": 1} and not c.has_snapshots(b"root")
    c.check([(b"b1", b"root", False), (b"first", None, False)], "test")


def test_check_names_what_is_off():
    c = Children()
    c.add(b"b1", b"root")
    with pytest.raises(AssertionError, match="tier X: the child sets are off"):
        c.check([], "tier X")
    c.add(b"s1", b"b1", snapshot=True)
    with pytest.raises(AssertionError, match="snapshot counts"):
        c.check([(b"b1", b"root", False), (b"s1", b"b1", False)], "tier X")

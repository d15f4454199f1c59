"""The collector's full passes kept out of requests (daemon/gc_pacer.py): the idle engine
collects what its work left and freezes the survivors, and cycles are still freed."""

from __future__ import annotations

import gc
import time
import weakref

import pytest

from ckptd.daemon import gc_pacer
from ckptd.daemon.gc_pacer import GcPacer
from ckptd.model.loader import load_model
from ckptd.model.text.tokenizer import Tokenizer
from tests.daemon.engines import Client
from tests.daemon.test_engine_sharing import _prompt, make_engine


class Node:
    def __init__(self) -> None:
        self.me = self               # a cycle: only the collector frees it


@pytest.fixture
def thawed():
    """Tests here freeze this process's objects: leave none frozen for the next tests."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_collect_frees_new_cycles_and_freezes_the_rest(thawed):
    h = GcPacer()
    dead, alive = Node(), Node()
    gone = weakref.ref(dead)
    del dead
    before = gc.get_freeze_count()
    h.worked()
    h.collect()
    assert gone() is None                           # collected, not frozen
    assert gc.get_freeze_count() > before
    assert alive.me is alive                        # frozen objects are alive as ever
    assert not h.due()                              # nothing new since


def test_long_idle_frees_cycles_that_died_frozen(thawed, monkeypatch):
    h = GcPacer()
    node = Node()
    gone = weakref.ref(node)
    h.worked()
    h.collect()                                     # node is frozen now
    del node
    gc.collect()
    assert gone() is not None                       # the collector no longer looks at it
    monkeypatch.setattr(gc_pacer, "FULL_AFTER_S", 0.0)
    assert h.due()
    h.collect()                                     # idle long enough: a full pass
    assert gone() is None
    assert not h.due()


def test_idle_engine_collects_after_work(thawed, tiny_hybrid_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(gc_pacer, "COLLECT_AFTER_S", 0.0)
    model = load_model(tiny_hybrid_dir)
    client = Client(make_engine(model, Tokenizer.from_dir(tiny_hybrid_dir), tmp_path))
    try:
        client.run([_prompt(40, 1)])
        sched = client.engine
        deadline = time.monotonic() + 10
        while sched.gc_pacer.dirty and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not sched.gc_pacer.dirty              # collected once the queue was empty
        assert gc.get_freeze_count() > 0
        assert client.run([_prompt(40, 2)])[0].tokens   # and it serves on after it
    finally:
        client.close()

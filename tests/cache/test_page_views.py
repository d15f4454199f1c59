"""The restorer's views of the runner's pool pages (cache/restorer.py: PageViews): made
once and kept, made for the whole pool in the background before a long restore needs
them, made anew for a pool that replaced the old one."""

from __future__ import annotations

import threading

import torch

from ckptd.cache.restorer import PageViews


class Pool:
    """io.page_views as a CPU runner gives it, counting the views it made."""

    def __init__(self, pages: int) -> None:
        self.kv = torch.zeros(pages, 2, 3)
        self.made = 0
        self.threads: set[str] = set()

    def page_views(self, pages):
        self.made += len(pages)
        self.threads.add(threading.current_thread().name)
        return [self.kv[p] for p in pages]


def test_a_warm_up_makes_every_view_beside_the_caller_and_once():
    pool = Pool(64)
    views = PageViews(pool)
    views.warm(64)
    views.warm(64)                                  # asked again: nothing more
    got = views.of([5, 63, 0])                      # waits for the warm-up under way
    assert [v.data_ptr() for v in got] == [pool.kv[p].data_ptr() for p in (5, 63, 0)]
    assert any(name.startswith("ckptd-views") for name in pool.threads)
    made = pool.made
    assert made == 64 + 1                           # the pool's pages, one probe
    got[1].fill_(7)
    assert torch.equal(pool.kv[63], torch.full((2, 3), 7.0))
    views.of(list(range(64)))
    assert pool.made == made + 1                    # kept: only the probe again


def test_views_of_a_replaced_pool_are_made_anew():
    pool = Pool(8)
    views = PageViews(pool)
    views.warm(8)
    first = views.of([1, 2])
    pool.kv = torch.zeros(8, 2, 3)                  # the runner's pool replaced
    again = views.of([1, 2])
    assert [v.data_ptr() for v in again] == [pool.kv[p].data_ptr() for p in (1, 2)]
    assert first[0].data_ptr() != again[0].data_ptr()


def test_no_views_where_the_runner_offers_none():
    class Device:
        def page_views(self, pages):
            return None
    views = PageViews(Device())
    views.warm(16)
    assert views.of([0, 1]) is None

"""The restorer's views of the runner's pool pages (cache/page_views.py): made once and
kept, made anew for a pool that replaced the old one; a restore's pool pages make a
view only when one is asked for, all of them in one call when the pieces need them,
and know where each page is without any."""

from __future__ import annotations

import torch

from ckptd.cache.page_views import PageViews


class Pool:
    """io.page_views and page_addresses as a CPU runner gives them, counting the views
    it made."""

    def __init__(self, pages: int) -> None:
        self.kv = torch.zeros(pages, 2, 3)
        self.made = 0

    def page_views(self, pages):
        self.made += len(pages)
        return [self.kv[p] for p in pages]

    def page_addresses(self, pages):
        step = self.kv.stride(0) * self.kv.element_size()
        return [self.kv.data_ptr() + p * step for p in pages]


def test_views_are_made_once_and_kept():
    pool = Pool(64)
    views = PageViews(pool)
    got = views.of([5, 63, 0])
    assert [v.data_ptr() for v in got] == [pool.kv[p].data_ptr() for p in (5, 63, 0)]
    got[1].fill_(7)
    assert torch.equal(pool.kv[63], torch.full((2, 3), 7.0))
    made = pool.made
    views.of([5, 63, 0])
    assert pool.made == made + 1                    # kept: only the pool's probe


def test_pool_pages_make_only_the_views_asked_for():
    pool = Pool(64)
    views = PageViews(pool)
    pages = views.pages(list(range(10, 40)))
    assert len(pages) == 30 and pool.made == 1      # the probe of the first page
    assert pages.addresses() == [pool.kv[p].data_ptr() for p in range(10, 40)]
    tail = pages[20:]
    assert len(tail) == 10 and tail.addresses() == pages.addresses()[20:]
    tail[3].fill_(5)                                # page 33, its view made alone
    assert torch.equal(pool.kv[33], torch.full((2, 3), 5.0)) and pool.made == 2
    head = pages[:4].tensors()                      # the pieces' pages, in one call
    assert [t.data_ptr() for t in head] == [pool.kv[p].data_ptr() for p in range(10, 14)]
    assert pool.made == 2 + 1 + 3                   # a probe, and pages 11-13 (10 kept)


def test_views_of_a_replaced_pool_are_made_anew():
    pool = Pool(8)
    views = PageViews(pool)
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
    assert views.of([0, 1]) is None and views.pages([0, 1]) is None


def test_consecutive_pool_pages_are_one_tensor_for_a_frame():
    """A pool laid out by head (pages not contiguous): a frame's consecutive pages are
    one strided view of the pool (io.page_run), written in one copy."""

    class Runner(Pool):
        def page_run(self, first, n):
            return self.kv[first:first + n]

        def page_addresses(self, pages):
            return None                              # not contiguous: no addresses

    pool = Runner(16)
    pages = PageViews(pool).pages([3, 4, 5, 9])
    assert pages.addresses() == [-1] * 4
    run = pages.run(0, 3)
    run.fill_(2)
    assert torch.equal(pool.kv[3:6], torch.full((3, 2, 3), 2.0)) and pool.kv[2].sum() == 0
    assert pages.run(2, 2) is None                   # pages 5 and 9: not consecutive
    assert pages.run(3, 2) is None                   # past the end

"""The restorer's views of the runner's pool pages, made when a restore needs them.

A view is a tensor object (~2-5 us to make); a 250K-token restore writes ~15,625
pages. Blocks read one by one (RAM, LMDB) each need their page's view, made in one
call for all of them. The remote's frames need none but the first page of each run
of pages that lie end to end (~120 for 250K tokens): they are written through one
buffer from that page on, the pages' addresses known from the pool without views;
in a pool laid out by head (pages not contiguous) through one strided view of the
frame's pages, when they are consecutive pages of the pool.
Making every view before such a restore held the interpreter ~30 ms while the
transfer's threads waited.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch


class PageViews:
    """Views of the pool's pages, each made once and kept. The pool is allocated once;
    should it ever be replaced, the views are made anew (each view holds its pool's
    memory, so a new pool can't sit at the old address)."""

    def __init__(self, io) -> None:
        self.io = io
        self.made: dict[int, torch.Tensor] = {}
        self.anchor: tuple[int, int] | None = None   # a page and where its view was
        self.lock = threading.Lock()

    def of(self, pages) -> list[torch.Tensor] | None:
        """Views of pages (io.page_views), or None where the runner offers none."""
        with self.lock:
            return self._of(pages)

    def pages(self, pages: list[int]) -> PoolPages | None:
        """The pages as a restore's output, their views made when asked for; None where
        the runner offers no views."""
        if not pages or self.of(pages[:1]) is None:      # checks the pool is the same
            return None
        where = getattr(self.io, "page_addresses", None)
        return PoolPages(self, pages, where(pages) if where is not None else None)

    def one(self, page: int) -> torch.Tensor:
        """Page's view (PoolPages: the pool was checked when they were made)."""
        view = self.made.get(page)
        if view is None:
            view = self.io.page_views([page])[0]
            with self.lock:
                view = self.made.setdefault(page, view)
        return view

    def _of(self, pages) -> list[torch.Tensor] | None:
        if self.anchor is not None:
            page, ptr = self.anchor
            probe = self.io.page_views([page])
            if probe is None or probe[0].data_ptr() != ptr:
                self.made.clear()                      # another pool (or none)
                self.anchor = None
        made = self.made
        missing = [p for p in pages if p not in made]
        if missing:
            views = self.io.page_views(missing)
            if views is None:
                return None
            made.update(zip(missing, views))
            if self.anchor is None:
                self.anchor = (missing[0], views[0].data_ptr())
        return [made[p] for p in pages]


class PoolPages(Sequence):
    """Pool pages a restore writes into ([*kv_shape()] CPU views, as Reader.load takes
    them), each page's view made when first asked for; `tensors` makes all of them in
    one call, `addresses` says where each page starts without any."""

    def __init__(self, views: PageViews, pages: list[int], where: list[int] | None) -> None:
        self.views, self.ids, self.where = views, pages, where

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return PoolPages(self.views, self.ids[i],
                             self.where[i] if self.where is not None else None)
        return self.views.one(self.ids[i])

    def tensors(self) -> list[torch.Tensor]:
        return self.views.of(self.ids) if self.ids else []

    def addresses(self) -> list[int]:
        """Where each page's bytes start (io.page_addresses); -1 where the runner does
        not say (a pool whose pages are not contiguous: see `run`)."""
        return self.where if self.where is not None else [-1] * len(self.ids)

    def run(self, i: int, n: int) -> torch.Tensor | None:
        """Pages i .. i + n - 1 as one [n, *kv_shape()] tensor when they are consecutive
        pages of the pool (io.page_run: a pool laid out by head, whose pages are not
        contiguous, takes a frame's pages in one strided copy); else None."""
        ids = self.ids[i:i + n]
        take = getattr(self.views.io, "page_run", None)
        if take is None or len(ids) != n or ids != list(range(ids[0], ids[0] + n)):
            return None
        return take(ids[0], n)

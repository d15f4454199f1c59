"""Paces the cyclic garbage collector: its full passes are kept out of requests.

A loaded daemon holds hundreds of thousands of objects the collector tracks (torch's
modules, the model, the store's index: an entry per cached block), and a full pass
walks them all, for longer than a restore takes. Python runs one whenever enough new
objects have survived, so after a restart (the index just read in) the first restores
paid for it, several times over (docs/BENCHMARKS.md, Measurements behind the code).

So the daemon collects once after loading and freezes what is alive (`gc.freeze`: the
collector no longer walks those objects), and does the same whenever the scheduler
goes idle after work, which costs only the objects made since. Garbage is still freed
by reference counting; only cycles among frozen objects would outlive their use, so
after a longer idle spell everything is unfrozen and collected once in full.
"""

from __future__ import annotations

import gc
import time

COLLECT_AFTER_S = 1.0     # idle collect + freeze at most this often
FULL_AFTER_S = 60.0       # idle this long after a collect: one full pass


class GcPacer:
    def __init__(self) -> None:
        self.dirty = False                # work was done since the last collect
        self.collected = time.monotonic()
        self.full_due = False             # a collect happened since the last full pass

    def freeze(self) -> None:
        """Collect in full, then freeze every object alive (after loading)."""
        gc.collect()
        gc.freeze()
        self.collected = time.monotonic()
        self.dirty = self.full_due = False

    def worked(self) -> None:
        """A request finished: there are new objects to collect or freeze."""
        self.dirty = True

    def due(self) -> bool:
        now = time.monotonic()
        return (self.dirty and now - self.collected >= COLLECT_AFTER_S) or \
            (self.full_due and now - self.collected >= FULL_AFTER_S)

    def collect(self) -> None:
        """Called while idle: collect the objects made since the last collect and freeze
        the survivors; after a long idle spell, a full pass over everything."""
        now = time.monotonic()
        if self.full_due and not self.dirty and now - self.collected >= FULL_AFTER_S:
            gc.unfreeze()
            self.freeze()
            return
        gc.collect()
        gc.freeze()
        self.collected = time.monotonic()
        self.dirty, self.full_due = False, True

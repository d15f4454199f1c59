"""Where a new sequence's prefill stops to leave a snapshot (the cache manager asks once
per restore): where the prompt parts from what is cached or from a prompt waiting for
it, and, for a hybrid (whose state can't be cut back: an attention-only model restores
at any block or cut page), at its anchors, interval positions within the snapshot byte
budget, and its tails within their byte and time budgets (cache/checkpoints.py has the
arithmetic of each). No state is taken inside an image: a stop there moves to its start.
"""

from __future__ import annotations

from collections.abc import Collection

from ckptd.cache.checkpoints import (
    TAIL_COST_SHARE,
    TailCosts,
    interval_stops,
    snapshot_budget,
    step_ends,
    tail_budget,
    tail_stops,
)
from ckptd.cache.entry import BRANCH, INTERVAL, TAIL, TAIL_OFFSETS
from ckptd.cache.work import Tracked
from ckptd.model.spec import StateSpec
from ckptd.model.vision.positions import inside


class StopPlanner:
    def __init__(self, spec: StateSpec, rates, interval: int, max_snapshots: int,
                 snapshot_ratio: float, step_tokens: int | None) -> None:
        """rates: the restorer's measured rates (cache/restorer.py), read at each plan.
        step_tokens: the scheduler's prefill chunk, where tail snapshots cost no step of
        their own (None: unknown)."""
        self.spec, self.rates = spec, rates
        self.interval, self.max_snapshots = interval, max_snapshots
        self.snapshot_ratio, self.step_tokens = snapshot_ratio, step_tokens

    def plan(self, rec: Tracked, asked: Collection[int], anchors: Collection[int],
             tails: bool) -> None:
        """Fill rec.stops. asked: branch points asked before the sequence was admitted.
        Intervals leave room for the rest within --max-snapshots, so that none of what
        this prefill leaves is thinned at once; a tail where a step ends anyway costs no
        step, and an interval stop there serves as one."""
        P, end, spec = rec.seq.num_computed, rec.prompt_len, self.spec
        images = rec.seq.images

        def placed(ps) -> set[int]:
            return {q for q in (before_image(images, p) for p in ps) if P < q < end}

        branch = placed({rec.shared, *asked})
        if spec.is_hybrid:
            branch |= placed(anchors)
        for p in branch:
            rec.stops[p] = BRANCH
        if not spec.is_hybrid:
            return
        count = tail_budget(end - P, spec, self.snapshot_ratio) if tails else 0
        costs = self._tail_costs(end - P)
        for reserved in range(min(count, len(TAIL_OFFSETS)) + 1):    # the most intervals
            room = self.max_snapshots - 1 - len(branch) - reserved
            budget = min(snapshot_budget(end, spec, self.snapshot_ratio), room)
            interval = placed(interval_stops(P, end, self.interval, budget)) - branch
            planned = branch | interval
            free = (step_ends(P, end, planned, self.step_tokens) if self.step_tokens
                    else planned)
            tail = placed(tail_stops(P, end, max(branch, default=0), count, free, costs))
            tail -= planned                          # an interval stop serves as one
            if len(tail) <= reserved:
                break
        for p in interval:
            rec.stops[p] = INTERVAL
        for p in tail:
            rec.stops[p] = TAIL

    def _tail_costs(self, tokens: int) -> TailCosts:
        """What tails cost a prefill of `tokens`, by the measured rates: a step's fixed
        part, a snapshot's copy off the device, within TAIL_COST_SHARE of its time."""
        r = self.rates
        return TailCosts(r.step_seconds, self.spec.snapshot_bytes() / r.bytes_per_s["host"],
                         TAIL_COST_SHARE * tokens / r.prefill_tps)


def before_image(images, p: int) -> int:
    """p, or the start of the image p would fall inside: no state is taken there."""
    im = inside(images, p)
    return p if im is None else im.start

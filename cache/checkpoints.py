"""Where a sequence leaves checkpoints, and how they reach the store.

A prefill stops (its step's chunk ends) at every position in its plan and leaves a
snapshot there:

    branch     where the prompt parts from what is cached or being computed: the
               next prompt with the same start computes only what is its own; and
               where the prompt's own structure says the next one will part (its
               anchors: a chat's last user message and generation prompt, a named
               context's end), taken while the first prompt is computed
    tail       a few offsets before a raw prompt's end (TAIL_OFFSETS, hybrid models):
               the next question after the same document parts there, within their
               own byte budget and TAIL_COST_SHARE of the prefill's time: where a step
               ends anyway they cost no step (tail_stops); a branch point replaces
               them (cache/store/thin.py)
    interval   every snapshot_interval tokens of a long prefill (hybrid models, whose
               recurrent state can't be cut back), spaced so that their bytes stay
               within a budget: dense near the prompt's end, sparse far from it
    end        the end of the prompt (with its last logits) and of the answer

A checkpoint is captured right after the step that reaches it (copies of the blocks
the store lacks and the snapshot) and put into the store later, off the first
token's path: at the next admit, when the engine goes idle, or when the sequence
finishes (tail checkpoints: once the prompt is done). The stop plan is pure functions
(interval_stops, step_ends, tail_stops), tested alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from functools import partial

import torch

from ckptd.cache.entry import END, TAIL_OFFSETS
from ckptd.cache.keys import KeyChain
from ckptd.cache.snapshot import Snapshot
from ckptd.cache.store import CacheStore
from ckptd.cache.work import Tracked
from ckptd.model.spec import StateSpec


def interval_stops(start: int, end: int, interval: int, max_count: int) -> list[int]:
    """Interval snapshot positions for a prefill from `start` to `end` (both
    excluded): multiples of `interval`, at most max_count of them, kept nearest the
    end and spaced about geometrically back from it (1, 2, 4, ... intervals), since
    later prompts mostly part from a long context near its end."""
    first = start // interval + 1
    last = (end - 1) // interval
    if last < first or max_count <= 0:
        return []
    if last - first + 1 <= max_count:
        return [k * interval for k in range(first, last + 1)]
    picked: set[int] = set()
    step, k = 1, last
    while k >= first and len(picked) < max_count:
        picked.add(k)
        k -= step
        step *= 2
    for k in range(last, first - 1, -1):            # what is left: next to the end
        if len(picked) >= max_count:
            break
        picked.add(k)
    return sorted(k * interval for k in picked)


# The bound: tail snapshots may make a cold prefill at most this much slower
TAIL_COST_SHARE = 0.03


def step_ends(start: int, end: int, stops: Collection[int], step: int) -> set[int]:
    """Where a lone prefill from `start` to `end` ends its steps before `end`: every
    `step` tokens, counted again from each stop (a chunk ends at the next stop). These
    are the places a snapshot costs no step of its own."""
    ends, pos = set(), start
    ahead = sorted(p for p in stops if start < p < end)
    while True:
        pos = min([pos + step, end, *(p for p in ahead if p > pos)])
        if pos >= end:
            return ends
        ends.add(pos)


@dataclass(frozen=True)
class TailCosts:
    """What tail snapshots cost a prefill's first token, in seconds (Rates measures the
    parts): a stop where no step ends costs one more step (its fixed part: the weights
    read, the per-step work); every one captures a snapshot on the way; together they
    may add `allowed` (TAIL_COST_SHARE of the prefill's expected time)."""
    step: float
    snapshot: float
    allowed: float


def tail_stops(start: int, end: int, floor: int, count: int,
               free: Collection[int] = (), costs: TailCosts | None = None) -> list[int]:
    """Tail snapshot positions of a prompt of `end` tokens computed from `start`, nearest
    the end first, at most `count`, all above `floor` (a branch point planned there
    replaces those below it). Each TAIL_OFFSETS rung o has a window, from o back from
    the end up to the rung before it: a position in `free` (where a step ends anyway)
    inside it serves the rung without a step of its own (the deepest such one), else
    the stop goes at end - o. With `costs`, a rung is left out when it would take the
    tails past their allowed time."""
    got: list[int] = []
    spent, near = 0.0, 0
    for o in TAIL_OFFSETS:
        lo, hi, near = end - o, end - near, o
        if lo <= max(start, floor) or len(got) >= count:
            break
        at = max((p for p in free if lo <= p < hi), default=None)
        cost = 0.0 if costs is None else costs.snapshot + (costs.step if at is None else 0.0)
        if costs is not None and spent + cost > costs.allowed:
            continue
        spent += cost
        got.append(lo if at is None else at)
    return got


def tail_budget(tokens: int, spec: StateSpec, ratio: float = 1.0) -> int:
    """How many tail snapshots a prefill computing `tokens` may leave: their bytes stay
    within `ratio` times the KV bytes it computes (none for a short prompt on a model
    whose snapshot outweighs it: recomputing its end is cheap anyway)."""
    snap = spec.snapshot_bytes()
    if snap <= 0:
        return 0
    return int(tokens * spec.kv_bytes_per_token() * ratio // snap)


def snapshot_budget(tokens: int, spec: StateSpec, ratio: float = 1.0) -> int:
    """How many interval snapshots a prefill of `tokens` may leave: their bytes stay
    within `ratio` times the KV bytes of the context itself (a 35B-A3B-shaped state
    is ~63 MB a snapshot against ~20 KB of KV a token: at 1.0, one per ~3K tokens)."""
    snap = spec.snapshot_bytes()
    if snap <= 0:
        return 0
    return max(1, int(tokens * spec.kv_bytes_per_token() * ratio // snap))


@dataclass
class Checkpoint:
    """A state captured after a step, put into the store later."""
    tokens: list[int]
    salt: str | bytes | None
    chain: KeyChain
    first_block: int
    pages: torch.Tensor | None    # blocks first_block.. [n, *kv_shape()], or None
    snapshot: Snapshot
    role: str                     # INTERVAL, END, BRANCH or TAIL (cache/entry.py)
    seq_id: int = -1


class Checkpointer:
    def __init__(self, io, spec: StateSpec, store: CacheStore | None,
                 max_snapshots: int) -> None:
        self.io, self.spec, self.store = io, spec, store
        self.B = spec.block_size
        self.max_snapshots = max_snapshots
        self.pending: list[Checkpoint] = []
        # snapshot bytes captured, by role: what each kind of stop costs (tools/bench/cache)
        self.snapshot_bytes: Counter[str] = Counter()

    def capture(self, rec: Tracked, logits: torch.Tensor | None, role: str) -> None:
        """Copy what a checkpoint at seq.num_computed stores: the full blocks the store
        lacks and a snapshot. The caller has published the sequence's pages."""
        seq, B, io = rec.seq, self.B, self.io
        P = seq.num_computed
        n_full = P // B
        kv = self.spec.attention is not None
        first, pages = rec.stored_blocks, None
        snap = Snapshot()
        # on a GPU the copies to the host run beside the next step; store_pending waits
        with io.deferred_reads():
            if n_full > first:          # no attention: empty blocks, the snapshots' parents
                pages = io.read_pages(seq.pages[first:n_full])
            if P % B and kv:
                snap.kv = io.read_partial(seq.pages[n_full], P % B)
            if self.spec.is_hybrid:
                snap.conv, snap.ssm = io.read_recurrent(seq.cell)
        rec.stored_blocks = max(first, n_full)
        self.snapshot_bytes[role] += sum(t.nbytes for t in snap.tensors().values())
        if logits is not None:
            snap.logits = logits.detach().float().to("cpu", copy=True)   # kept on the host
        self.pending.append(Checkpoint(seq.tokens[:P], seq.salt, rec.chain, first, pages,
                                       snap, role, seq.id))

    def capture_blocks(self, rec: Tracked, upto: int) -> None:
        """Copy the sequence's blocks the store lacks below block `upto`, and no snapshot:
        a window model's blocks before the device lets their window part go
        (cache/windows.py). Its chain holds their keys (the pages are published)."""
        seq, first = rec.seq, rec.stored_blocks
        if upto <= first:
            return
        with self.io.deferred_reads():
            pages = self.io.read_pages(seq.pages[first:upto])
        rec.stored_blocks = upto
        self.pending.append(Checkpoint(seq.tokens[:upto * self.B], seq.salt, rec.chain,
                                       first, pages, Snapshot(), END, seq.id))

    def store_pending(self) -> None:
        """Put the captured checkpoints. After a remote restore they go behind its
        write-through (their parents are the blocks it keeps: the restore counted them
        as stored, so a checkpoint reads and puts only the blocks after them)."""
        pending, self.pending = self.pending, []
        if pending:
            self.io.wait_reads()
        if pending and self.store is not None \
                and self.store.reader.writes.after(partial(self._put, pending)):
            return
        self._put(pending)

    def _put(self, pending: list[Checkpoint]) -> None:
        for cp in pending:
            if cp.pages is not None:
                self.store.put_blocks(cp.tokens, cp.first_block, cp.pages, cp.salt,
                                      chain=cp.chain)
            if cp.snapshot:
                self.store.put_snapshot(cp.tokens, cp.snapshot, cp.salt,
                                        keep=self.max_snapshots, chain=cp.chain, role=cp.role)

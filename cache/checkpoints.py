"""Where a sequence leaves checkpoints, and how they reach the store.

A prefill stops (its step's chunk ends) at every position in its plan and leaves a
snapshot there:

    branch     where the prompt parts from what is cached or being computed: the
               next prompt with the same start computes only what is its own
    interval   every snapshot_interval tokens of a long prefill (hybrid models, whose
               recurrent state can't be cut back), spaced so that their bytes stay
               within a budget: dense near the prompt's end, sparse far from it
    end        the end of the prompt (with its last logits) and of the answer

A checkpoint is captured right after the step that reaches it (copies of the blocks
the store lacks and the snapshot) and put into the store later, off the first
token's path: at the next admit, when the engine goes idle, or when the sequence
finishes. The stop plan is a pure function (interval_stops), tested alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
    role: str                     # INTERVAL, END or BRANCH (cache/entry.py)


class Checkpointer:
    def __init__(self, io, spec: StateSpec, store: CacheStore | None,
                 max_snapshots: int) -> None:
        self.io, self.spec, self.store = io, spec, store
        self.B = spec.block_size
        self.max_snapshots = max_snapshots
        self.pending: list[Checkpoint] = []

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
        if logits is not None:
            snap.logits = logits.detach().float().to("cpu", copy=True)   # kept on the host
        self.pending.append(Checkpoint(seq.tokens[:P], seq.salt, rec.chain, first, pages,
                                       snap, role))

    def store_pending(self) -> None:
        pending, self.pending = self.pending, []
        if pending:
            self.io.wait_reads()
        for cp in pending:
            if cp.pages is not None:
                self.store.put_blocks(cp.tokens, cp.first_block, cp.pages, cp.salt,
                                      chain=cp.chain)
            if cp.snapshot:
                self.store.put_snapshot(cp.tokens, cp.snapshot, cp.salt,
                                        keep=self.max_snapshots, chain=cp.chain, role=cp.role)

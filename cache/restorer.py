"""Restoring a new sequence from the longest cached prefix of its prompt.

The prompt's leading blocks still on the device are adopted (shared, no copy);
the store plans the rest (RAM, then disk) and a snapshot at the restore point.
A restore is planned by cost: reading bytes can be slower than recomputing a
short prefix, so the plan is taken only when its measured read time beats the
measured prefill rate. A piece that fails verification ends a load at the
longest good prefix; the plan is then made again below it, here, in one loop.
"""

from __future__ import annotations

import time

from ckptd.cache.device import DevicePages
from ckptd.cache.lookup import RestoredState, RestorePlan
from ckptd.cache.snapshot import Snapshot
from ckptd.cache.store import CacheStore
from ckptd.cache.work import RestoreInfo
from ckptd.model.spec import StateSpec

_ATTEMPTS = 8      # each failed load lowers the limit, so the loop ends anyway


class Rates:
    """Measured throughputs (exponential moving averages) for planning restores by cost."""

    def __init__(self) -> None:
        self.prefill_tps = 2000.0          # tokens/s; replaced by measurements
        self.bytes_per_s = {"host": 4e9, "disk": 3e8}

    def update_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= 16 and seconds > 0:
            self.prefill_tps = 0.8 * self.prefill_tps + 0.2 * tokens / seconds

    def update_read(self, tier: str, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            self.bytes_per_s[tier] = 0.8 * self.bytes_per_s[tier] + 0.2 * nbytes / seconds


class Restorer:
    def __init__(self, device: DevicePages, store: CacheStore | None, io, spec: StateSpec) -> None:
        self.device, self.store, self.io, self.spec = device, store, io, spec
        self.B = spec.block_size
        self.hybrid = spec.is_hybrid
        self.rates = Rates()

    def restore(self, rec, info: RestoreInfo) -> None:
        """Bring rec.seq (fresh, attached) to the deepest restorable state of its prompt;
        fills info. OutOfPages when the pages it needs can't be had (holding none)."""
        t0 = time.perf_counter()
        seq, chain = rec.seq, rec.chain
        n = len(seq.tokens)
        device = self.device.find(chain, n // self.B)
        dev, limit = len(device), n
        for attempt in range(_ATTEMPTS):
            plan = self._plan(rec, limit, dev)
            if not attempt:
                rec.shared = max(plan.shared, dev * self.B)
            if plan.position == n and plan.snapshot is None:
                plan = self._plan(rec, n - 1, dev)     # keep one token to compute
            if plan.position == 0:
                break
            t_read = time.perf_counter()
            restored, held = self._load(plan, device)
            if restored.ok and plan.position == n and restored.snapshot.logits is None:
                self.device.decref(held)               # no logits to sample from: stop short
                limit = n - 1
                continue
            if not restored.ok:
                self.device.decref(held)
                info.fallbacks += 1
                limit = min(restored.position, plan.position - 1)
                dev = min(dev, limit // self.B)
                continue
            for tier, nbytes in plan.bytes_by_tier().items():
                self.rates.update_read(tier, nbytes, time.perf_counter() - t_read)
            self._install(rec, restored, device, held)
            info.cached_tokens, info.tier = restored.position, restored.tier
            info.device_tokens = restored.first_block * self.B
            if restored.position == n:
                info.logits = restored.snapshot.logits
            # Blocks the store lacks (a device page outlived its stored copy) are put
            # again by the next checkpoint, so that its snapshot has a parent on disk.
            rec.stored_blocks = self._stored_run(chain, restored.position // self.B)
            break
        info.restore_ms = (time.perf_counter() - t0) * 1000

    def _plan(self, rec, limit: int, dev: int) -> RestorePlan:
        """The store's plan over the device pages; when reading the store would cost
        more than recomputing, the device pages alone (an attention-only model can
        restore at any block boundary; a hybrid needs a stored snapshot)."""
        seq, store = rec.seq, self.store
        plan = store.lookup(seq.tokens, seq.salt, max_tokens=limit, device_blocks=dev,
                            chain=rec.chain)
        if self._worth_it(plan):
            return plan
        if dev and not self.hybrid:
            return store.lookup(seq.tokens, seq.salt, max_tokens=min(limit, dev * self.B),
                                device_blocks=dev, chain=rec.chain)
        return RestorePlan(0, [], None, shared=plan.shared)

    def _worth_it(self, plan: RestorePlan) -> bool:
        read_s = sum(n / self.rates.bytes_per_s[t] for t, n in plan.bytes_by_tier().items())
        return read_s <= plan.position / self.rates.prefill_tps

    def _load(self, plan: RestorePlan, device: list[int]) -> tuple[RestoredState, list[int]]:
        """The store's load of a plan. Where the runner offers views of its pool pages (a
        CPU pool), blocks decode straight into pages taken for them here, which the
        caller then owns (the second value): no fresh buffer to fault in, no copy."""
        n = len(plan.blocks)
        if n == 0:
            return self.store.load(plan), []
        # The device pages found carry no reference until _install adopts them: hold
        # them while allocating, or the pool could reclaim one of them for these.
        found = device[:plan.device_blocks]
        self.device.incref(found)
        try:
            held = self.device.alloc(n)
        finally:
            self.device.decref(found)
        views = self.io.page_views(held)
        if views is None:
            self.device.decref(held)
            return self.store.load(plan), []
        try:
            return self.store.load(plan, views), held
        except BaseException:
            self.device.decref(held)
            raise

    def _install(self, rec, restored: RestoredState, device: list[int], held: list[int]) -> None:
        """Give the sequence its restored state. held: pool pages the store decoded
        blocks first.. into (see _load)."""
        seq, io, dev, B = rec.seq, self.io, self.device, self.B
        P, first = restored.position, restored.first_block
        n_full = P // B
        pages = list(device[:first])
        dev.incref(pages)
        if held:
            used = max(0, n_full - first)
            pages += held[:used]
            dev.decref(held[used:])
        seq.pages = pages
        try:
            if len(pages) < n_full or P % B:
                seq.pages += dev.alloc(-(-P // B) - len(pages))
        except BaseException:
            dev.decref(seq.pages)
            seq.pages = []
            raise
        if not held and n_full > first and restored.pages is not None:
            io.load_pages(seq.pages[first:n_full], restored.pages)
        snap = restored.snapshot or Snapshot()
        if P % B and snap.kv is not None:
            io.load_partial(seq.pages[n_full], snap.kv)
        if snap.conv is not None:
            io.load_recurrent(seq.slot, snap.conv, snap.ssm)
        seq.num_computed = P
        rec.published = min(first, rec.published) if rec.published else first

    def _stored_run(self, chain, n: int) -> int:
        """How many of the chain's first n blocks the store holds, by binary search:
        what is bound for disk is closed (a block is there only after its parent)."""
        has = self.store.has
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if has(chain.keys[mid - 1]):
                lo = mid
            else:
                hi = mid - 1
        return lo

"""Restoring a new sequence from the longest cached prefix of its prompt.

The prompt's leading blocks still on the device are adopted (shared, no copy);
the store plans the rest (RAM, then disk, then the remote tier) and a snapshot at
the restore point. A restore is planned by cost: reading bytes can be slower than
recomputing a short prefix, so of the plans at hand (local tiers only, with the
remote's pieces, the device pages alone, nothing) the one is taken whose measured
read time plus the prefill of what it leaves is least. The remote is asked only
when what it could add is worth more prefill time than its requests cost. A piece
that fails verification ends a load at the longest good prefix; the plan is then
made again below it, here, in one loop (without the remote, once it was slow).
"""

from __future__ import annotations

import gc
import time

from ckptd.cache.device import DevicePages, OutOfPages
from ckptd.cache.lookup import DEVICE, REMOTE, RestoredState, RestorePlan
from ckptd.cache.page_views import PageViews
from ckptd.cache.snapshot import Snapshot
from ckptd.cache.store import CacheStore
from ckptd.cache.why import gone as departures
from ckptd.cache.why.explain import Attempt, Declined, Failed
from ckptd.cache.why.report import TIER_FAULT, tier_runs, tokens_by_tier
from ckptd.cache.windows import Windows
from ckptd.cache.work import RestoreInfo
from ckptd.model.spec import StateSpec

_ATTEMPTS = 8      # each failed load lowers the limit, so the loop ends anyway
_HIT_FLOOR = 0.1   # the least share of remote searches assumed to find something
# A model step's fixed cost in prefill tokens until a decode step is measured: a step of
# a few tokens costs about as much as ~130 more in a long chunk (tiny hybrid on a 2-core
# EPYC: 16 tokens 6-9 ms, 1,024 tokens 52-64 ms; a GPU's decode step reads the weights,
# ~ a hundred tokens of its prefill too)
_STEP_TOKENS = 128


class Rates:
    """Measured throughputs (exponential moving averages) for planning restores by cost."""

    def __init__(self) -> None:
        self.prefill_tps = 2000.0          # tokens/s; replaced by measurements
        self.bytes_per_s = {"host": 4e9, "disk": 3e8, "remote": 1e8}
        # The remote is read in ranged GETs of many blocks, many in flight: a read costs
        # its rounds of requests (each a round trip) and its bytes.
        self.remote_latency = 0.02         # seconds per request (the client measures it)
        # How often asking the remote found something: a daemon serving fresh prompts
        # stops paying a search per prompt that can't pay off, never below a floor, so
        # a long shared context is still asked for.
        self.remote_hit = 1.0
        self.measured_step: float | None = None    # seconds; Engine measures decode steps

    def read_seconds(self, plan: RestorePlan) -> float:
        by_tier = plan.bytes_by_tier()
        s = sum(n / self.bytes_per_s[t] for t, n in by_tier.items() if t != REMOTE)
        if REMOTE in by_tier:
            s += plan.remote_rounds() * self.remote_latency \
                + by_tier[REMOTE] / self.bytes_per_s[REMOTE]
        return s

    def update_remote(self, rounds: int, nbytes: int, seconds: float) -> None:
        """A fetch of `nbytes` bytes in `rounds` rounds of requests took `seconds`: what
        its round trips do not explain is the bytes' time."""
        if nbytes > 0 and seconds > 0:
            self.update_read(REMOTE, nbytes, max(seconds - rounds * self.remote_latency,
                                                 seconds / 10))

    @property
    def step_seconds(self) -> float:
        """A model step's fixed cost (what one more prefill step adds): a decode step's
        time, as measured, else _STEP_TOKENS tokens of prefill."""
        if self.measured_step is not None:
            return self.measured_step
        return _STEP_TOKENS / self.prefill_tps

    def update_step(self, seconds: float) -> None:
        if seconds > 0:
            m = self.measured_step
            self.measured_step = seconds if m is None else 0.8 * m + 0.2 * seconds

    def update_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= 16 and seconds > 0:
            self.prefill_tps = 0.8 * self.prefill_tps + 0.2 * tokens / seconds

    def update_read(self, tier: str, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            self.bytes_per_s[tier] = 0.8 * self.bytes_per_s[tier] + 0.2 * nbytes / seconds


class Restorer:
    def __init__(self, device: DevicePages, store: CacheStore | None, io, spec: StateSpec,
                 windows: Windows | None = None) -> None:
        self.device, self.store, self.io, self.spec = device, store, io, spec
        self.windows = windows
        self.B = spec.block_size
        self.hybrid = spec.is_hybrid
        self.rates = Rates()
        self.views = PageViews(io)

    def restore(self, rec, info: RestoreInfo) -> None:
        """Bring rec.seq (fresh, attached) to the deepest restorable state of its prompt;
        fills info. OutOfPages when the pages it needs can't be had (holding none)."""
        # A long restore makes tens of thousands of small objects (a remote block's
        # meta, its piece, its location): the cyclic collector's passes over them were
        # ~40% of planning a 250K-token restore. It waits until the restore is done
        # (reference counting still frees everything; the daemon's pacer collects when
        # idle: daemon/gc_pacer.py).
        paused = gc.isenabled()
        gc.disable()
        try:
            self._restore(rec, info)
        finally:
            if paused:
                gc.enable()
            if self.store is not None and self.store.remote is not None:
                self.store.remote.fetcher.cancel_waiting()    # ranges no plan read

    def _restore(self, rec, info: RestoreInfo) -> None:
        t0 = time.perf_counter()
        seq, chain = rec.seq, rec.chain
        n = len(seq.tokens)
        device = self.device.find(chain, n // self.B)
        dev, limit, remote = len(device), n, self.store.remote is not None
        seen, runs = Attempt(0), []           # what the report explains (cache/why/)
        for attempt in range(_ATTEMPTS):
            plan, declined = self._plan(rec, limit, dev, remote)
            if not attempt:
                rec.shared = seen.shared = max(plan.shared, dev * self.B)
            if plan.position == n and plan.snapshot is None:
                plan, declined = self._plan(rec, n - 1, dev, remote)   # keep one to compute
            seen.declined = seen.declined or declined
            if plan.position == 0:
                break
            gap = self._window_gap(device, plan)
            if gap is not None:               # the store has what the device let go of
                dev = gap
                continue
            t_read = time.perf_counter()
            restored, held = self._load(plan, device, self._deadline(plan))
            if restored.ok and plan.position == n and restored.snapshot.logits is None:
                self.device.decref(held)               # no logits to sample from: stop short
                limit = n - 1
                continue
            if not restored.ok:
                self.device.decref(held)
                info.fallbacks += 1
                seen.failed = seen.failed or _failed(plan, restored, self.B)
                if REMOTE in plan.bytes_by_tier():
                    # A slow remote: this request recomputes rather than wait again. A
                    # bad or missing object: the remote may still serve what is below it.
                    r = self.store.remote
                    remote = not r.fetcher.last_late and r.available()
                    self.rates.update_remote(*r.fetcher.last)
                limit = min(restored.position, plan.position - 1)
                dev = min(dev, limit // self.B)
                continue
            for tier, nbytes in plan.bytes_by_tier().items():
                if tier != REMOTE:
                    self.rates.update_read(tier, nbytes, time.perf_counter() - t_read)
            if REMOTE in plan.bytes_by_tier():
                self.rates.update_remote(*self.store.remote.fetcher.last)
            self._install(rec, restored, device, held)
            info.cached_tokens, info.tier = restored.position, restored.tier
            info.device_tokens = restored.first_block * self.B
            runs = tier_runs(plan.blocks, plan.snapshot, plan.position, restored.first_block,
                             self.B)
            info.by_tier = tokens_by_tier(runs)
            if restored.position == n:
                info.logits = restored.snapshot.logits
            # Blocks the store lacks (a device page outlived its stored copy) are put
            # again by the next checkpoint, so that its snapshot has a parent on disk.
            # The remote's blocks count once the blocks before them are stored: the
            # write-through keeps them, and the next checkpoint waits for it.
            full, kept = restored.position // self.B, restored.kept_from
            stored = self._stored_run(chain, full if kept is None else kept)
            rec.stored_blocks = full if kept is not None and stored == kept else stored
            break
        info.restore_ms = (time.perf_counter() - t0) * 1000
        seen.restored = info.cached_tokens
        info.report = self.store.why.report(seq.id, seq.tokens, seq.salt, chain, seen, runs,
                                            info.restore_ms)

    def _plan(self, rec, limit: int, dev: int, remote: bool
              ) -> tuple[RestorePlan, Declined | None]:
        """The cheapest of: the store's local plan over the device pages, the device
        pages alone (an attention-only model can restore at any block boundary; a
        hybrid needs a stored snapshot), nothing, and (remote) the plan with the
        remote tier's pieces. Also the local plan when it was not taken for its cost."""
        seq, store = rec.seq, self.store
        best = store.lookup(seq.tokens, seq.salt, max_tokens=limit, device_blocks=dev,
                            chain=rec.chain)
        declined = None
        if not self._worth_it(best):
            declined = Declined(best.position, best.tier or DEVICE, best.total_bytes,
                                self.rates.read_seconds(best),
                                best.position / self.rates.prefill_tps)
            if dev and not self.hybrid:
                best = store.lookup(seq.tokens, seq.salt, max_tokens=min(limit, dev * self.B),
                                    device_blocks=dev, chain=rec.chain)
            else:
                best = RestorePlan(0, [], None, shared=best.shared)
        if remote and self._ask_remote(best.position, limit):
            self.rates.remote_latency = store.remote.latency()
            plan = store.lookup_remote(seq.tokens, limit, rec.chain, dev, best.position)
            if plan is not None:                       # None: it is cooling off
                found = plan.position >= best.position + self.B
                self.rates.remote_hit = max(_HIT_FLOOR,
                                            0.8 * self.rates.remote_hit + 0.2 * found)
            if plan is not None and plan.position > best.position \
                    and self._cost(plan, limit) < self._cost(best, limit):
                plan.shared = max(plan.shared, best.shared)
                best = plan
            elif plan is not None and plan.remote is not None:
                store.remote.fetcher.cancel(plan.remote.transfer)     # not read: stop it
        return best, declined

    def _window_gap(self, device: list[int], plan: RestorePlan) -> int | None:
        """A window model: the first device page the plan's window reads (the pages
        within W of its position) that no longer holds its window part, else None."""
        w = self.windows
        if w is None or not w.on:
            return None
        lo, hi = w.low(plan.position), min(plan.device_blocks, -(-plan.position // self.B))
        held = self.io.has_window(device[lo:hi]) if lo < hi else []
        return None if all(held) else lo + held.index(False)

    def _worth_it(self, plan: RestorePlan) -> bool:
        return self.rates.read_seconds(plan) <= plan.position / self.rates.prefill_tps

    def _cost(self, plan: RestorePlan, limit: int) -> float:
        """Seconds to read the plan and compute what it leaves of tokens[:limit]."""
        return self.rates.read_seconds(plan) + (limit - plan.position) / self.rates.prefill_tps

    def _ask_remote(self, have: int, limit: int) -> bool:
        """Whether the remote is expected to save more prefill than finding out costs:
        the prefill it could spare times how often asking found something, against the
        round trips of a search (a batch of LISTs, a state's head)."""
        gain = limit - have
        if gain < self.B:
            return False
        rounds = self.store.remote.search_rounds
        expected = self.rates.remote_hit * gain / self.rates.prefill_tps
        return expected > rounds * self.store.remote.latency()

    def _deadline(self, plan: RestorePlan) -> float:
        """Seconds the plan's remote pieces may take before the restore gives up on
        them: a few times the estimate, and no less than recomputing what the plan
        covers (waiting that long still beats it), within the remote's fetch_timeout."""
        remote = self.store.remote
        if remote is None:
            return 0.0
        wait = max(1.0, 3 * self.rates.read_seconds(plan), plan.position / self.rates.prefill_tps)
        return min(remote.config.fetch_timeout, wait)

    def _load(self, plan: RestorePlan, device: list[int], remote_timeout: float
              ) -> tuple[RestoredState, list[int]]:
        """The store's load of a plan. Where the runner offers views of its pool pages (a
        CPU pool), blocks decode straight into pages taken for them here, which the
        caller then owns (the second value): no fresh buffer to fault in, no copy."""
        n = len(plan.blocks)
        if n == 0:
            return self.store.load(plan, remote_timeout=remote_timeout), []
        # The device pages found carry no reference until _install adopts them: hold
        # them while allocating, or the pool could reclaim one of them for these.
        found = device[:plan.device_blocks]
        self.device.incref(found)
        try:
            held = self.device.alloc(n)
        finally:
            self.device.decref(found)
        views = self.views.pages(held)
        if views is None:
            self.device.decref(held)
            return self.store.load(plan, remote_timeout=remote_timeout), []
        try:
            return self.store.load(plan, views, remote_timeout), held
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
            w = self.windows
            if w is not None and w.on and not w.keep(seq.pages[max(first, w.low(P)):]):
                raise OutOfPages("no room left for the window layers' KV")
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
            io.load_recurrent(seq.cell, snap.conv, snap.ssm)
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


def _failed(plan: RestorePlan, restored: RestoredState, B: int) -> Failed:
    """What a failed load reports: the piece at the good prefix's end failed."""
    i = restored.position // B - plan.device_blocks
    piece = plan.blocks[i] if 0 <= i < len(plan.blocks) else plan.snapshot
    tier = piece.tier if piece is not None else DEVICE
    return Failed(plan.position, departures.CORRUPT if restored.dropped else TIER_FAULT, tier)

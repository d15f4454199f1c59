"""The checkpointing engine: restore the longest cached prefix, leave checkpoints behind.

A restore builds a fresh sequence from the cheapest tiers: the prefix's full
pages still on the device are adopted (shared, no copy; daemon/sharing.py), the
rest of the blocks are copied in from the store (RAM, then disk), then the
snapshot's partial-page KV and its recurrent state, which every sequence gets
its own copy of. Prefill then continues from the restored position. Checkpoints
are taken at snapshot_interval boundaries during prefill, at the end of the
prompt (with the last logits, so an exact repeat computes nothing) and at the
end of a generation (so the next chat turn resumes after this answer); each new
snapshot thins the older ones on its prefix to at most `max_snapshots`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ckptd.cache.lookup import DEVICE, RestoredState, RestorePlan
from ckptd.cache.store.store import CacheStore
from ckptd.daemon.sharing import DevicePrefixes
from ckptd.kernels import ops
from ckptd.model.runner import Runner, Sequence


@dataclass
class RestoreInfo:
    cached_tokens: int = 0
    tier: str | None = None       # the slowest tier read: "device", "host", "disk" or None
    device_tokens: int = 0        # of cached_tokens, those in adopted device pages
    restore_ms: float = 0.0
    logits: torch.Tensor | None = None   # last-position logits, when the snapshot had them
    fallbacks: int = 0            # plans abandoned because a piece failed verification

    def tokens_by_tier(self) -> dict[str, int]:
        """Restored tokens by the tier that held them."""
        out = {DEVICE: self.device_tokens} if self.device_tokens else {}
        rest = self.cached_tokens - self.device_tokens
        if rest and self.tier is not None:
            out[self.tier] = out.get(self.tier, 0) + rest
        return out


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


class Engine:
    def __init__(self, runner: Runner, store: CacheStore | None,
                 snapshot_interval: int = 1024, max_snapshots: int = 16) -> None:
        if store is not None and store.B != runner.block_size:
            raise ValueError("store and runner must use the same block size")
        if snapshot_interval % runner.block_size:
            raise ValueError(f"snapshot_interval ({snapshot_interval}) must be a multiple of "
                             f"block_size ({runner.block_size})")
        if max_snapshots < 2:
            # 1 would keep only the newest: an answer's snapshot would delete the one at
            # the end of its prompt, which the next question on that prompt restores from
            raise ValueError(f"max_snapshots must be >= 2, got {max_snapshots}")
        self.runner, self.store = runner, store
        self.B = runner.block_size
        self.interval = snapshot_interval
        self.max_snapshots = max_snapshots
        self.rates = Rates()
        self.hybrid = runner.spec.is_hybrid
        self.shared = DevicePrefixes(runner, store) if store is not None else None

    # ---- restore -----------------------------------------------------------------
    def admit(self, tokens: list[int], salt: str | None, use_cache: bool,
              keys: list[bytes] | None = None) -> tuple[Sequence, RestoreInfo]:
        """A new sequence for a prompt, restored from the longest cached prefix (keys: the
        prompt's block keys when the caller has them already)."""
        seq = self.runner.add(tokens)
        seq.salt, seq.stored_blocks, seq.use_cache = salt, 0, use_cache
        info = RestoreInfo()
        if not use_cache or self.store is None:
            return seq, info
        t0 = time.perf_counter()
        try:
            self._restore(seq, tokens, salt, info, keys)
        except BaseException:
            self.runner.release(seq)          # an OutOfPages requeues the request
            raise
        info.restore_ms = (time.perf_counter() - t0) * 1000
        return seq, info

    def _restore(self, seq: Sequence, tokens: list[int], salt: str | None,
                 info: RestoreInfo, keys: list[bytes] | None) -> None:
        device, keys = self.shared.find(tokens, salt, keys)
        self.shared.start(seq, keys)
        dev = len(device)
        for _ in range(8):                  # each failed load drops a piece, so this ends
            plan = self._plan(tokens, salt, len(tokens), dev)
            if plan.position == len(tokens) and plan.snapshot is None:
                plan = self._plan(tokens, salt, len(tokens) - 1, dev)
            if plan.position == 0:
                return
            t_read = time.perf_counter()
            restored, held = self._load(plan, device)
            if restored.ok and plan.position == len(tokens) \
                    and "logits" not in (restored.snapshot or {}):
                self.runner.pages.decref(held)
                plan = self._plan(tokens, salt, len(tokens) - 1, dev)
                if plan.position == 0:
                    return
                restored, held = self._load(plan, device)
            if not restored.ok:
                self.runner.pages.decref(held)
                info.fallbacks += 1
                continue
            for tier, n in plan.bytes_by_tier().items():
                self.rates.update_read(tier, n, time.perf_counter() - t_read)
            self._install(seq, restored, device, held)
            info.cached_tokens, info.tier = restored.position, restored.tier
            info.device_tokens = restored.first_block * self.B
            if restored.position == len(tokens):
                info.logits = restored.snapshot["logits"]
            # Blocks the store lacks (a device page outlived its stored copy) are put
            # again by the next checkpoint, so that its snapshot has a parent on disk.
            seq.stored_blocks = self._stored_run(keys[:restored.position // self.B])
            return

    def _load(self, plan: RestorePlan, device: list[int]) -> tuple[RestoredState, list[int]]:
        """The store's load of a plan. On a CPU pool its blocks decode straight into
        pool pages taken for them here, which the caller then owns (the second value):
        no fresh output buffer to fault in and no copy into the pool after it."""
        kv, pool = self.runner.state.kv, self.runner.pages
        n = len(plan.blocks) - plan.device_blocks
        if kv is None or kv.device.type != "cpu" or n <= 0:
            return self.store.load(plan), []
        # The device pages found carry no reference until _install adopts them: hold
        # them while allocating, or the pool could reclaim one of them for these.
        found = device[:plan.device_blocks]
        pool.incref(found)
        try:
            held = pool.alloc(n)
        finally:
            pool.decref(found)
        try:
            return self.store.load(plan, [kv[p] for p in held]), held
        except BaseException:
            pool.decref(held)
            raise

    def _stored_run(self, keys: list[bytes]) -> int:
        """How many of these leading block keys the store holds."""
        for i, found in enumerate(self.store.find_many(keys)):
            if found is None:
                return i
        return len(keys)

    def _plan(self, tokens: list[int], salt: str | None, limit: int, dev: int) -> RestorePlan:
        """The store's plan over the device pages; when reading the store would cost
        more than recomputing, the device pages alone (an attention-only model can
        restore at any block boundary; a hybrid needs a stored snapshot)."""
        plan = self.store.lookup(tokens, salt, max_tokens=limit, device_blocks=dev)
        if self._worth_it(plan):
            return plan
        if dev and not self.hybrid:
            return self.store.lookup(tokens, salt, max_tokens=min(limit, dev * self.B),
                                     device_blocks=dev)
        return RestorePlan(0, [], None)

    def _worth_it(self, plan: RestorePlan) -> bool:
        read_s = sum(n / self.rates.bytes_per_s[t] for t, n in plan.bytes_by_tier().items())
        return read_s <= plan.position / self.rates.prefill_tps

    def _install(self, seq: Sequence, restored: RestoredState, device: list[int],
                 held: list[int]) -> None:
        """held: pool pages the store decoded blocks first.. into (see _load)."""
        P, first = restored.position, restored.first_block
        r = self.runner
        if first:
            self.shared.adopt(seq, device[:first])
        n_full = P // self.B
        if held:
            used = max(0, n_full - first)
            seq.pages += held[:used]
            r.pages.decref(held[used:])
        r.reserve(seq, P)
        state = r.state
        if n_full > first and state.kv is not None and restored.pages is not None:
            ops.scatter_pages(state.kv, seq.pages[first:n_full], restored.pages)
        snap = restored.snapshot or {}
        if P % self.B and state.kv is not None:
            kv = snap["kv"]                                  # [n_attn, 2, r, Hkv, D]
            state.kv[seq.pages[n_full], :, :, :kv.shape[2]] = kv.to(state.kv.dtype)
        if state.conv is not None:
            state.conv[seq.slot] = snap["conv"].to(state.conv.dtype)
            state.ssm[seq.slot] = snap["ssm"].to(state.ssm.dtype)
        seq.num_computed = P
        self.shared.publish(seq)             # pages copied in from the store serve the next

    # ---- checkpoints -------------------------------------------------------------
    def next_chunk(self, seq: Sequence, budget: int) -> int:
        """Prefill tokens to compute next: at most `budget`, ending on a snapshot
        boundary when one is near, so interval snapshots land exactly."""
        left = len(seq.tokens) - seq.num_computed
        n = min(left, budget)
        if self.store is not None and seq.use_cache and self.hybrid:
            to_boundary = self.interval - seq.num_computed % self.interval
            if to_boundary < n:
                n = to_boundary
        return max(n, 1)

    def after_prefill_step(self, seq: Sequence, logits: torch.Tensor | None) -> None:
        """Called after each prefill chunk: pages that filled up are shared at once (a
        request arriving meanwhile adopts them); interval snapshot, or the end-of-prompt
        one."""
        if self.store is None or not seq.use_cache:
            return
        self.shared.publish(seq)
        done = seq.num_computed == len(seq.tokens)
        if done:
            self.checkpoint(seq, logits)
        elif seq.num_computed % self.interval == 0:
            self.checkpoint(seq, None)

    def checkpoint(self, seq: Sequence, logits: torch.Tensor | None) -> None:
        """Store the full blocks computed so far and a snapshot at num_computed."""
        if self.store is None or not seq.use_cache or seq.num_computed == 0:
            return
        state, P = self.runner.state, seq.num_computed
        tokens = seq.tokens[:P]
        n_full = P // self.B
        if n_full > seq.stored_blocks and state.kv is not None:
            pages = ops.gather_pages(state.kv, seq.pages[seq.stored_blocks:n_full])
            self.store.put_blocks(tokens, seq.stored_blocks, pages, seq.salt)
        seq.stored_blocks = max(seq.stored_blocks, n_full)
        self.shared.publish(seq)
        snap = {}
        if P % self.B and state.kv is not None:
            snap["kv"] = state.kv[seq.pages[n_full], :, :, :P % self.B].clone(
                memory_format=torch.contiguous_format)
        if state.conv is not None:
            snap["conv"] = state.conv[seq.slot].clone()
            snap["ssm"] = state.ssm[seq.slot].clone()
        if logits is not None:
            snap["logits"] = logits.detach().float().clone()
        if snap:
            self.store.put_snapshot(tokens, snap, seq.salt, keep=self.max_snapshots)

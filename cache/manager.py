"""The cache manager: every tier behind one door, for the engine's loop.

    cache.restore(seq, chain)   a new sequence (the scheduler admits it): a cell, the
                                longest cached prefix, its planned snapshot stops
    cache.chunk(seq, budget)    how much of it a step computes (the scheduler asks)
    cache.admit(batch)          pages for every work's tokens, or why not (refused)
    runner.run(...)
    cache.after_step(batch)     publish full pages, capture checkpoints
    ...
    cache.finish(seq)           the answer's checkpoint; pages and cell given back

Tiers, fastest first: device pages (cache/device.py, shared in place), then the
store (cache/store/: RAM, LMDB). A restore (cache/restorer.py) adopts the device
pages of the prompt's leading blocks and reads the rest from the store. Each new
sequence gets a plan of where its prefill stops to leave a snapshot (cache/stops.py: branch
points, interval positions within a byte budget) and the end of its prompt; the
checkpoints are captured after the step that reaches them and stored off the
first token's path (cache/checkpoints.py). The runner owns the state tensors; the
manager reads and writes them only through StateIO (model/spec.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

from ckptd.cache.checkpoints import Checkpointer
from ckptd.cache.device import DevicePages, OutOfPages
from ckptd.cache.entry import BRANCH, END, TAIL
from ckptd.cache.keys import KeyChain
from ckptd.cache.lookup import DEVICE
from ckptd.cache.restorer import Restorer
from ckptd.cache.stops import StopPlanner, before_image
from ckptd.cache.store import CacheStore
from ckptd.cache.why.gone import BUDGET, EVICTED
from ckptd.cache.windows import Windows
from ckptd.cache.work import Deferred, Failed, RestoreInfo, Stalled, Tracked, Work
from ckptd.model.sequence import Sequence, check_token_ids
from ckptd.model.spec import StateIO, StateSpec, StepLogits
from ckptd.model.vision.positions import inside


class CacheManager:
    def __init__(self, io: StateIO, spec: StateSpec, num_pages: int, fingerprint: str,
                 store: CacheStore | None = None, snapshot_interval: int = 1024,
                 max_snapshots: int = 16, snapshot_budget: float = 1.0,
                 step_tokens: int | None = None) -> None:
        """snapshot_budget: a prefill's interval snapshots take at most this many times
        its context's KV bytes (cache/checkpoints.py). step_tokens: the scheduler's
        prefill chunk, where tail snapshots cost no step of their own (None: unknown)."""
        B = spec.block_size
        if store is not None and store.B != B:
            raise ValueError("store and runner must use the same block size")
        if store is not None and store.fp != fingerprint:
            # the store names its keys with its fingerprint (chain): they must be the model's
            raise ValueError("the store was opened for another model's fingerprint")
        if snapshot_interval <= 0 or snapshot_interval % B:
            raise ValueError(f"snapshot_interval ({snapshot_interval}) must be a positive "
                             f"multiple of block_size ({B})")
        if max_snapshots < 2:
            # 1 would keep only the newest: an answer's snapshot would delete the one at
            # the end of its prompt, which the next question on that prompt restores from
            raise ValueError(f"max_snapshots must be >= 2, got {max_snapshots}")
        self.io, self.spec, self.B = io, spec, B
        self.store = store
        if snapshot_budget <= 0:
            raise ValueError(f"snapshot_budget must be positive, got {snapshot_budget}")
        windowed = spec.attention is not None and bool(spec.attention.windows)
        self.device = DevicePages(num_pages, B, None if store is None else self._device_evicted,
                                  io.drop_window if windowed else None)
        self.checkpoints = Checkpointer(io, spec, store, max_snapshots)
        self.live: dict[int, Tracked] = {}
        self.windows = Windows(io, spec, self.checkpoints, self.device, self.live)
        self.restorer = Restorer(self.device, store, io, spec, self.windows)
        self.rates = self.restorer.rates
        self.stops = StopPlanner(spec, self.rates, snapshot_interval, max_snapshots,
                                 snapshot_budget, step_tokens)
        self.branches: dict[int, set[int]] = {}   # seq id -> branch points asked before
        #                                           it was admitted

    @property
    def enabled(self) -> bool:
        """Whether anything is cached: without a store, sequences only get pages."""
        return self.store is not None

    @property
    def pending(self) -> list:
        return self.checkpoints.pending

    def chain(self, tokens: list[int], salt: str | None, images: tuple = ()) -> KeyChain:
        """A prompt's block keys (the store's: CacheStore.chain), hashed once per request
        and carried on it after. images: the spans of its images (Sequence.images),
        named in the keys."""
        return self.store.chain(tokens, salt, media=images)

    def common_prefix(self, a: KeyChain, a_tokens: list[int], b: KeyChain,
                      b_tokens: list[int]) -> int:
        """How many leading tokens two prompts share: whole blocks by their keys (a
        binary search: equal keys mean equal prefixes), then token by token."""
        ka, kb = a.keys, b.keys
        lo, hi = 0, min(len(ka), len(kb))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ka[mid - 1] == kb[mid - 1]:
                lo = mid
            else:
                hi = mid - 1
        n, end = lo * self.B, min(len(a_tokens), len(b_tokens))
        while n < end and a_tokens[n] == b_tokens[n]:
            n += 1
        return min(n, _images_part(a.ctx.media, b.ctx.media))

    def add_branch(self, seq: Sequence, position: int) -> None:
        """Ask a prefill to stop at `position` and leave a snapshot there (a waiting
        prompt parts from it there). Before the sequence is admitted, kept for then."""
        rec = self.live.get(seq.id)
        position = before_image(seq.images, position)
        if rec is None:
            self.branches.setdefault(seq.id, set()).add(position)
        elif rec.chain is not None and seq.num_computed < position < rec.prompt_len:
            rec.stops[position] = BRANCH

    def admit(self, batch: list[Work]) -> None:
        """Pages for each work's n tokens, running sequences first (they must go on), new
        ones with what is left; a shared page the step writes is copied first. A work
        that can't have them is refused: a new sequence Deferred (it holds nothing), a
        running one Stalled; and when no work can run at all, the newest stalled one
        gives its pages back (a prefill is Deferred, its checkpoints make the next try
        cheap; a decode fails). Captured checkpoints go into the store first, unless a
        prefill is in its tail: its last steps then wait for none of that (its tails'
        blocks and snapshots are at most TAIL_WINDOW tokens' worth)."""
        if not self._in_tail():
            self.checkpoints.store_pending()
        for w in sorted(batch, key=lambda w: w.new):
            if not w.runs:
                continue
            try:
                self._make_writable(w.seq, w.seq.num_computed + w.n)
            except OutOfPages:
                if w.new:
                    self.release(w.seq)
                    w.refused = Deferred()
                else:
                    w.refused = Stalled()
        if not any(w.runs for w in batch):
            self._preempt(batch)

    def after_step(self, batch: list[Work], logits: StepLogits) -> None:
        """After the model step over the batch's work: publish the pages that filled up
        (up to the tokens a draft leaves in doubt: those are verified after the step),
        capture the checkpoints planned at the positions reached."""
        for w in batch:
            if not w.runs:
                continue
            rec = self.live[w.seq.id]
            P = w.seq.num_computed - w.drafted
            if rec.chain is not None:
                self._publish(rec, P)
                if not rec.prompt_done:
                    if P == rec.prompt_len:
                        rec.prompt_done = True
                        self.checkpoints.capture(rec, logits.last(w.seq), END)
                    elif P in rec.stops:
                        self.checkpoints.capture(rec, None, rec.stops.pop(P))
            self.windows.advance(rec, P)

    def finish(self, seq: Sequence, checkpoint: bool = True) -> None:
        """A sequence is done: store its final state (checkpoint; the client has had
        its last token, and the next turn looks for this state), then give back its
        pages and cell. Finishing twice is harmless."""
        rec = self.live.get(seq.id)
        if rec is not None and checkpoint and rec.chain is not None and seq.num_computed:
            self._publish(rec, seq.num_computed)
            self.checkpoints.capture(rec, None, END)
            self.windows.advance(rec, seq.num_computed)
            self.checkpoints.store_pending()
        self.release(seq)

    def release(self, seq: Sequence) -> None:
        rec = self.live.pop(seq.id, None)
        self.branches.pop(seq.id, None)
        if rec is not None and seq.pages:
            full = min(seq.num_computed // self.B, rec.published)
            if full:
                self.device.touch(seq.pages[full - 1])     # its run stays the freshest
            # the prefix table keeps its pages; their window parts, only its last window's
            self.windows.advance(rec, seq.num_computed, capture=False)
        self.device.decref(seq.pages)
        seq.pages = []
        self.io.detach(seq)

    def store_pending(self) -> None:
        """Put captured checkpoints into the store now (the engine is idle), and let
        what remote restores read go into LMDB."""
        self.checkpoints.store_pending()
        if self.store is not None:
            self.store.reader.writes.idle_now()

    def close(self) -> None:
        self.checkpoints.store_pending()
        if self.store is not None:
            self.store.close()

    # start, fork and prepare also serve tests and tools that drive a runner directly
    def start(self, tokens: list[int], salt: str | None = None, use_cache: bool = True,
              chain: KeyChain | None = None) -> tuple[Sequence, RestoreInfo]:
        """A new sequence with a cell, restored from the longest cached prefix. Raises
        OutOfPages / OutOfCells, holding nothing, when there is no room."""
        check_token_ids(tokens, self.io.vocab_size)
        seq = Sequence(list(tokens), salt, use_cache)
        return seq, self.restore(seq, chain)

    def fork(self, seq: Sequence) -> Sequence:
        """A new sequence with seq's tokens and state, sharing all its pages (the partial
        one too: whichever of the two writes it first gets a copy)."""
        parent = self.live[seq.id]
        child = Sequence(list(seq.tokens), seq.salt, seq.use_cache, lora=seq.lora,
                         images=seq.images)
        self.io.attach(child)
        n = -(-seq.num_computed // self.B)
        child.pages = seq.pages[:n]
        self.device.incref(child.pages)
        child.num_computed = seq.num_computed
        if self.spec.is_hybrid and seq.num_computed:
            self.io.load_recurrent(child.cell, *self.io.read_recurrent(seq.cell))
        full = seq.num_computed // self.B
        chain = None if parent.chain is None else parent.chain.copy(full)
        self.live[child.id] = Tracked(child, chain, parent.prompt_len, parent.prompt_done,
                                      parent.stored_blocks, min(parent.published, full),
                                      window_low=parent.window_low)
        return child

    def prepare(self, work: list[tuple[Sequence, int]]) -> None:
        """Pages for each (sequence, n): writable for its next n tokens."""
        for seq, n in work:
            self._make_writable(seq, seq.num_computed + n)

    def restore(self, seq: Sequence, chain: KeyChain | None = None,
                anchors: Collection[int] = (), tails: bool = True) -> RestoreInfo:
        """Attach a new sequence (a cell) and bring it to the longest cached prefix of its
        tokens, planning where its prefill stops for snapshots. chain: its block keys,
        when hashed already. anchors: positions where the prompt's structure says the
        next prompt will part (a chat's last user message, a named context's end);
        tails: leave tail snapshots near the end (a raw prompt's). OutOfPages /
        OutOfCells when there is no room, and any other failure, leave nothing held."""
        self.checkpoints.store_pending()    # a restore may want what the last step captured
        self.io.attach(seq)
        use = seq.use_cache and self.enabled
        if use and chain is None:
            chain = self.chain(seq.tokens, seq.salt, seq.images)
        rec = Tracked(seq, chain if use else None, len(seq.tokens))
        self.live[seq.id] = rec
        info = RestoreInfo()
        if not use:
            return info
        try:
            self.restorer.restore(rec, info)
        except BaseException:
            self.release(seq)
            raise
        rec.prompt_done = info.logits is not None       # an exact repeat: nothing to compute
        self.windows.restored(rec, seq.num_computed)
        self.stops.plan(rec, self.branches.pop(seq.id, ()), anchors, tails)
        self._publish(rec, seq.num_computed)             # restored pages serve the next
        return info

    def chunk(self, seq: Sequence, budget: int) -> int:
        """How many of seq's tokens not computed yet a step of at most `budget` of them
        computes: up to its next planned stop, where a snapshot is captured; 0 when none
        is left or the budget is 0. A chunk never ends inside an image: it stops before
        one, or, starting at an image, takes all of it, past the budget if need be (the
        scheduler lets one such chunk into a step)."""
        P = seq.num_computed
        n = min(len(seq.tokens) - P, budget)
        if n <= 0:
            return 0
        rec = self.live[seq.id]
        if rec.stops and not rec.prompt_done:
            ahead = [p for p in rec.stops if p > P]
            if ahead:
                n = min(n, min(ahead) - P)
        im = inside(seq.images, P + n)
        if im is not None:
            n = im.start - P if im.start > P else im.end - P
        return n

    def _in_tail(self) -> bool:
        """Whether a pending checkpoint is a tail of a prompt still being computed."""
        for cp in self.checkpoints.pending:
            rec = self.live.get(cp.seq_id) if cp.role == TAIL else None
            if rec is not None and not rec.prompt_done:
                return True
        return False

    def _preempt(self, batch: list[Work]) -> None:
        """No work can run: the newest stalled one gives its pages back. A prefill is
        deferred (back to the queue); a decode can't go back, and fails."""
        stalled = [w for w in batch if isinstance(w.refused, Stalled)]
        if not stalled:
            return
        w = stalled[-1]
        if w.seq.num_computed >= self.live[w.seq.id].prompt_len:
            w.refused = Failed(OutOfPages("out of KV cache memory: the running sequences "
                                          "need more pages than the pool holds (--kv-budget)"))
        else:
            self.release(w.seq)
            w.refused = Deferred()

    def _make_writable(self, seq: Sequence, end: int) -> None:
        """Give seq private pages up to `end` tokens: pages it shares that the step will
        write are copied first (copy-on-write), missing ones allocated. All or nothing."""
        B, dev = self.B, self.device
        need = -(-end // B)
        copies = [i for i in range(seq.num_computed // B, min(len(seq.pages), need))
                  if dev.is_shared(seq.pages[i])]
        grow = max(0, need - len(seq.pages))
        if not copies and not grow:
            return
        fresh = dev.alloc(len(copies) + grow)
        if not self.windows.keep(fresh):               # the step writes every one of them
            dev.decref(fresh)
            raise OutOfPages("no room left for the window layers' KV")
        for i, new in zip(copies, fresh):
            self.io.copy_page(seq.pages[i], new)
            dev.decref([seq.pages[i]])
            seq.pages[i] = new
        seq.pages += fresh[len(copies):]

    def _publish(self, rec: Tracked, upto: int) -> None:
        """Register the sequence's full pages of its first `upto` computed tokens on the
        device. Where an equal page is there already (two sequences computed the same
        prefix at once), the sequence switches to it and its own copy is freed: the
        prefix is held once."""
        seq, B = rec.seq, self.B
        n = upto // B
        if n <= rec.published or rec.chain is None:
            return
        chain = rec.chain
        chain.extend(seq.tokens, n)
        keys, data, w, dev = chain.keys, chain.data, 4 * B, self.device
        for i in range(rec.published, n):
            page = seq.pages[i]
            held = dev.register(keys[i], keys[i - 1] if i else None, page,
                                data[i * w:(i + 1) * w])
            if held != page and self.windows.lacks(rec, i, held):
                continue                # the table's copy lost the window part it reads
            if held != page:
                dev.incref([held])
                dev.decref([page])
                seq.pages[i] = held
        rec.published = n

    def _device_evicted(self, rows: list[tuple[bytes, bytes | None, int]], why: str) -> None:
        """The device forgot these blocks: a departure for each the store lacks (its copy
        restores the others), unless a budget refused its write first (cache/why/)."""
        lost = self.store.catalog.lacking(rows)
        if lost:
            self.store.gone.blocks_left(lost, EVICTED, DEVICE, why, unless=BUDGET)

    def sanity_check(self) -> None:
        """Check what must always hold, between steps: every page reference has a holder
        (a live sequence or the prefix table), cells belong to live sequences, and the
        store's index, pins and byte counts add up. AssertionError names what broke."""
        holders: Counter[int] = Counter()
        for rec in self.live.values():
            seq = rec.seq
            holders.update(seq.pages)
            assert seq.cell >= 0, f"live sequence {seq.id} has no cell"
            assert rec.published <= seq.num_computed // self.B
            assert len(seq.pages) * self.B >= seq.num_computed
        self.device.sanity_check(holders)
        self.windows.check()
        cells = {rec.seq.cell for rec in self.live.values()}
        assert cells == self.io.live_cells(), \
            f"cells in use {sorted(self.io.live_cells())}, held by sequences {sorted(cells)}"
        if self.store is not None:
            self.store.sanity_check()


def _images_part(a, b) -> int:
    """Where two prompts' images first differ (start, grid or digest): the most tokens
    they can share, whatever their tokens (placeholders of equal-sized images match)."""
    for x, y in zip(a, b):
        if (x.start, x.grid, x.digest) != (y.start, y.grid, y.digest):
            return min(x.start, y.start)
    if len(a) != len(b):
        return (a[len(b)] if len(a) > len(b) else b[len(a)]).start
    return 1 << 62


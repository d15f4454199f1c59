"""What the remote holds of one prompt beyond the local tiers, found in two round trips.

States are listed by cell (layout.py): the states of cell c of a prefix are the
objects under `state/{key before block cG}/`, named by position and key. The prompt's
cells are LISTed from the deepest down, `fanout` at a time, until a batch names a
state of this prompt: for a state at P the key the prompt's own tokens hash to at P
(its block key at P // B - 1 and its tail) is computed and compared, so the key check
is the token check. Then one ranged GET reads the deepest such state's head, which
names the segment and offset of every block below it: the whole plan, in one LIST
round (for a prompt within `fanout` cells of a state) and one GET.

Everything found is a claim, not a fact: the load checks each value (checksum, model,
key) as it decodes it, and anything that fails counts as missing or corrupt, never
served. A head that fails its own checks is deleted (it is the index of nothing).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

from ckptd.cache import codec
from ckptd.cache.entry import SNAPSHOT, EntryMeta
from ckptd.cache.keys import KeyChain, snapshot_key
from ckptd.cache.lookup import REMOTE, PieceRef
from ckptd.cache.remote import state as state_obj
from ckptd.cache.remote.client import ObjectInfo, RemoteClient, RemoteError
from ckptd.cache.remote.fetch import Fetcher
from ckptd.cache.remote.frames import Frame
from ckptd.cache.remote.layout import STATE, Layout, framed
from ckptd.cache.remote.ranges import Loc, Transfer
from ckptd.cache.remote.run import Run, Span
from ckptd.cache.remote.state import SegmentRef, StateHead

_TRIES = 3          # state heads one lookup may read (the deepest first)


@dataclass
class Found:
    """The remote's entries for one prompt, as planning reads them (cache/lookup.py),
    and where each one's bytes are."""
    # the blocks the head named, from the first the local tiers lack (None: none)
    run: Run | None = None
    snaps: dict[bytes, list[tuple[bytes, EntryMeta]]] = field(default_factory=dict)
    # where each piece listed one by one is (the snapshot; a test's values)
    places: dict[bytes, Loc] = field(default_factory=dict)
    block_bytes: int = 0
    segments: list[tuple[SegmentRef, list[bytes], bytes]] = field(default_factory=list)
    fetcher: Fetcher | None = None
    state: str | None = None      # the state object whose head named these pieces
    transfer: Transfer | None = None      # their ranges, started when the head was read
    requests: int = 0
    seconds: float = 0.0
    failed: bool = False          # a request failed: what was found may be partial
    bad: set[str] = field(default_factory=set)      # state objects whose head was bad
    dropped: list[tuple[bytes, EntryMeta]] = field(default_factory=list)   # their states
    deadline: float = 0.0         # perf_counter time the search gives up

    @property
    def where(self) -> dict[bytes, Loc]:
        """key -> where its bytes are, for every entry found (the run's blocks made one
        by one: for failures and tests, not a restore's path)."""
        if self.run is None:
            return self.places
        run = self.run
        out = {k: run.span_of(b).loc for k, b in run.index().items()}
        out.update(self.places)
        return out

    @property
    def framed(self) -> dict[bytes, tuple[Frame, int]]:
        """key -> (its frame, its index there), for the run's blocks of framed segments."""
        run = self.run
        if run is None:
            return {}
        out = {}
        for k, b in run.index().items():
            s = run.span_of(b)
            if s.frame is not None:
                out[k] = (s.frame, b - s.first)
        return out

    @property
    def metas(self) -> dict[bytes, EntryMeta]:
        run = self.run
        out = {} if run is None else {k: run.meta(b).entry() for k, b in run.index().items()}
        for found in self.snaps.values():
            out.update(found)
        return out

    def meta(self, key: bytes) -> EntryMeta:
        found = next((m for found in self.snaps.values() for k, m in found if k == key), None)
        return found if found is not None else self.metas[key]

    def places_of(self, pieces: Sequence[PieceRef]) -> dict[bytes, Loc]:
        """key -> Loc for these pieces: `places`, unless some are the run's blocks."""
        places = self.places
        return places if all(p.key in places for p in pieces) else self.where

    def locs(self, pieces: Sequence[PieceRef], run: Run | None = None) -> list[Loc]:
        """Where the pieces' bytes are (the run's spans first): a location once, however
        many blocks of one frame read it."""
        where = self.places_of(pieces)
        return list(dict.fromkeys([*(run.locs() if run is not None else ()),
                                   *(where[p.key] for p in pieces)]))

    def rounds(self, pieces: Sequence[PieceRef], run: Run | None = None) -> int:
        """Request rounds reading these (remote) pieces and run takes (a plan counts it
        once: RestorePlan.remote_rounds)."""
        if self.fetcher is None:
            return len(pieces) + len(run or ())
        return self.fetcher.rounds(self.locs(pieces, run))


class LayeredView:
    """The local tiers first (the store's Catalog), then what the remote holds."""

    def __init__(self, local, found: Found) -> None:
        self.local, self.found = local, found

    def find_many(self, keys: Sequence[bytes]) -> list[tuple[EntryMeta, str] | None]:
        return self.local.find_many(keys)        # the remote's blocks: run_after

    def run_after(self, block: int, end: int) -> Run | None:
        """The remote's blocks from `block` on (up to `end`), when its run reaches there."""
        run = self.found.run
        if run is None or not run.lo <= block < run.hi:
            return None
        return run.cut(block, end)

    def has_snapshots(self, parent: bytes) -> bool:
        return parent in self.found.snaps or self.local.has_snapshots(parent)

    def children_after(self, parent: bytes) -> list[tuple[bytes, EntryMeta, str]]:
        out = self.local.children_after(parent)
        have = {k for k, _, _ in out}
        return out + [(k, m, REMOTE) for k, m in self.found.snaps.get(parent, ())
                      if k not in have]


class Finder:
    def __init__(self, client: RemoteClient, layout: Layout, fetcher: Fetcher) -> None:
        self.client, self.layout, self.fetcher = client, layout, fetcher
        self.fanout = client.config.concurrency
        self.tensor, self.block_bytes = "", 0     # a block's page, as framed heads name it
        self.lookups = self.requests = self.corrupt = 0

    def find(self, chain: KeyChain, tokens: list[int], limit: int, first: int,
             floor: int) -> Found:
        """The deepest state of the prompt on the remote that covers more than `floor`
        tokens and at most `limit`, with its blocks first .. (blocks before `first`
        are held locally). The ranges of what it names start coming at once
        (Found.transfer): the caller's planning runs while they do."""
        t0 = time.perf_counter()
        out = Found(fetcher=self.fetcher, deadline=t0 + self.client.config.lookup_timeout)
        guess = self._guess(chain, tokens, limit, floor)
        out.requests += guess is not None
        try:
            cells = self._cells(chain, limit, floor)
            listing = self._list(chain, cells[:self.fanout], out)
            if guess is not None:
                name, key, asked = guess
                got = self._parallel(None, [asked], out)[0]   # counted when asked for
                # the deepest state there can be: when it is usable the LISTs can only
                # confirm it, and are not waited for
                if got is not None and self._take(chain, tokens, first, limit, key,
                                                  ObjectInfo(name, got[1], 0.0), out, got):
                    out.requests -= sum(f.cancel() for f in listing)   # never asked
                    listing = None
            if listing is not None:
                found = self._candidates(chain, tokens, limit, floor, cells, listing, out)
                for P, key, obj in found[:_TRIES]:
                    if guess is not None and obj.name == guess[0]:
                        continue                  # read above, and not usable
                    if self._take(chain, tokens, first, P, key, obj, out):
                        break
        except RemoteError:
            out.failed = True
        if guess is not None:
            guess[2].cancel()                 # not needed, or over (its request counted)
        out.seconds = time.perf_counter() - t0
        self.lookups += 1
        self.requests += out.requests
        return out

    def _take(self, chain: KeyChain, tokens: list[int], first: int, P: int, key: bytes,
              obj: ObjectInfo, out: Found, early=None) -> bool:
        """The state at P (key, in obj) when its head is readable and is the prompt's:
        its pieces into `out` and their transfer started; False otherwise."""
        head = self._head(obj, out, early)
        d, B = P // chain.block_size, chain.block_size
        if head is None:
            if obj.name in out.bad:               # deleted: a departure (lost.py)
                out.dropped.append((key, EntryMeta(
                    SNAPSHOT, chain.parent(d), P, tokens[d * B:P], self.layout.fp)))
            return False
        if (head.key, head.position, head.parent, head.tokens, head.blocks) != \
                (key, P, chain.parent(d), tokens[d * B:P], d):
            self.corrupt += 1         # a well-formed head of another state
            return False
        if any(s.framed for s in head.segments) and (
                head.tensor != self.tensor or head.block_bytes != self.block_bytes):
            return False              # pages of another shape: not ours to read
        out.transfer = self.fetcher.start(_ranges(head, obj, first))
        self._fill(chain, tokens, first, head, obj, out)
        return True

    def _cells(self, chain: KeyChain, limit: int, floor: int) -> list[int]:
        """The prompt's cells that may hold its states, deepest first."""
        B, G = chain.block_size, self.layout.grid
        n_full = min(limit // B, len(chain))
        cells = list(range(n_full // G, max(floor, 0) // B // G - 1, -1))
        return cells[:self.client.config.max_lists]

    def _list(self, chain: KeyChain, batch: list[int], out: Found) -> list[Future]:
        """LISTs of the states of cells `batch`, asked for (futures)."""
        G = self.layout.grid
        futs = [self.client.pool.submit(self.client.list, self.layout.states_of(
            chain.parent(c * G))) for c in batch]
        out.requests += len(futs)
        return futs

    def _candidates(self, chain: KeyChain, tokens: list[int], limit: int, floor: int,
                    cells: list[int], listing: list[Future], out: Found
                    ) -> list[tuple[int, bytes, ObjectInfo]]:
        """The prompt's states in the deepest batch of cells that has any, deepest
        first: (position, key, object). listing: the first batch's LISTs, asked for."""
        B, G, ctx = chain.block_size, self.layout.grid, chain.ctx
        n_full = min(limit // B, len(chain))
        for s in range(0, len(cells), self.fanout):
            batch = cells[s:s + self.fanout]
            listed = self._parallel(None, listing if s == 0 else self._list(chain, batch, out),
                                    out)
            found = []
            for c, objs in zip(batch, listed):
                for o in objs:
                    parsed = self.layout.parse(o.name)
                    if parsed is None or parsed[0] != STATE:
                        continue
                    key, P = parsed[2], parsed[3]
                    d = P // B
                    if not floor < P <= limit or d > n_full or d // G != c:
                        continue
                    if snapshot_key(chain.parent(d), tokens[d * B:P], d, B, ctx) == key:
                        found.append((P, key, o))
            if found:                  # framed before the old layout's at one position
                return sorted(found, key=lambda f: (-f[0], not framed(f[2].name)))
        return []

    def _guess(self, chain: KeyChain, tokens: list[int], limit: int, floor: int):
        """The head of the state at `limit` itself (framed), asked for beside the LISTs:
        its name follows from the prompt (a prompt asked again, or a context restored by
        another daemon, has its state there), and when it is there the LISTs are not
        waited for. (name, key, future of get_range) or None where no state can be
        there."""
        B, G = chain.block_size, self.layout.grid
        d = limit // B
        if limit <= floor or d > len(chain):
            return None
        key = snapshot_key(chain.parent(d), tokens[d * B:limit], d, B, chain.ctx)
        name = self.layout.state(chain.parent(d // G * G), limit, key)
        return name, key, self.client.pool.submit(self.client.get_range, name, 0,
                                                  state_obj.FIRST_READ)

    def _head(self, obj: ObjectInfo, out: Found, early=None) -> StateHead | None:
        """A state object's head (one ranged GET, two for a long head); None when it is
        gone, or corrupt (then deleted). early: the first GET's answer, when it was
        asked for already (_guess)."""
        first = early if early is not None else self._parallel(lambda n: self.client.get_range(
            n, 0, min(obj.size, state_obj.FIRST_READ)), [obj.name], out)[0]
        if first is None:
            return None
        data = first[0]
        try:
            need = state_obj.head_bytes(data)
            if need > len(data) and need <= obj.size:
                more = self._parallel(lambda n: self.client.get_range(n, len(data), need),
                                      [obj.name], out)[0]
                data = data + (more[0] if more else b"")
            return state_obj.read_head(data, self.layout.fp, self.layout.absolute)
        except codec.CorruptValue:
            self.corrupt += 1
            self.client.delete([obj.name])
            out.bad.add(obj.name)
            return None

    def _fill(self, chain: KeyChain, tokens: list[int], first: int, head: StateHead,
              obj: ObjectInfo, out: Found) -> None:
        """The head's blocks from `first` on as a run (their frames, or old-layout
        values, as spans: cache/remote/run.py), and its snapshot."""
        B, fp, ctx = chain.block_size, self.layout.fp, chain.ctx
        out.block_bytes = head.block_bytes
        spans: list[Span] = []
        end = None                     # where the segments stop being end to end
        for seg in sorted(head.segments, key=lambda s: s.start):
            keys = chain.keys[seg.start:seg.start + seg.used]
            out.segments.append((seg, keys, chain.parent(seg.start)))
            if end is not None and seg.start != end:
                break
            end = seg.start + seg.used
            name, total = seg.name, seg.size
            if seg.framed:
                spans += [Span(seg.start + b, f.blocks, Loc(name, off, n, total), f)
                          for (b, off, n), f in zip(seg.frame_spans(), seg.frames)
                          if b < seg.used]
            else:
                spans += [Span(b, 1, Loc(name, off, n, total), None) for b, off, n in zip(
                    range(seg.start, end), seg.offsets(), seg.lengths)]
        if end is not None and first < end:
            out.run = Run(chain, tokens, spans, first, end, fp, head.block_bytes,
                          ctx.plain, time.time())
        d = head.position // B
        n = obj.size - head.snapshot_at
        meta = EntryMeta(SNAPSHOT, head.parent, head.position, head.tokens, fp,
                         stored_bytes=n, logical_bytes=head.logical_bytes,
                         plain=ctx.plain(d, B), role=head.role)
        out.snaps[head.parent] = [(head.key, meta)]
        out.places[head.key] = Loc(obj.name, head.snapshot_at, n, obj.size)
        out.state = obj.name

    def _parallel(self, fn, names, out: Found) -> list:
        """fn(name) for each name on the client's pool (or, fn None: names are futures
        asked for already, their results); RemoteError when one failed or the lookup's
        time is up (a slow remote must not hold up the engine's step)."""
        if fn is None:
            futs = list(names)
        else:
            futs = [self.client.pool.submit(fn, n) for n in names]
            out.requests += len(futs)
        done, late = wait(futs, timeout=max(0.0, out.deadline - time.perf_counter()))
        if late:
            for f in late:
                f.cancel()
            self.client.gave_up("lookup", self.client.config.lookup_timeout)
            raise RemoteError("timeout", "the remote did not answer the lookup in time")
        return [f.result() for f in futs]


def _ranges(head: StateHead, obj: ObjectInfo, first: int) -> list[Loc]:
    """Where the values a plan from this head reads lie: the frames (or old-layout
    values) holding its blocks from `first` on, then its snapshot. The same locations
    _fill gives its blocks, so a restore's fetch takes the transfer of these over."""
    out = []
    for seg in head.segments:
        end = seg.start + seg.used
        if end <= first:
            continue
        if seg.framed:
            b = seg.start
            for (_, off, n), f in zip(seg.frame_spans(), seg.frames):
                if b < end and b + f.blocks > first:
                    out.append(Loc(seg.name, off, n, seg.size))
                b += f.blocks
        else:
            out += [Loc(seg.name, off, n, seg.size) for b, (off, n) in enumerate(
                zip(seg.offsets(), seg.lengths), seg.start) if first <= b < end]
    out.append(Loc(obj.name, head.snapshot_at, obj.size - head.snapshot_at, obj.size))
    return out

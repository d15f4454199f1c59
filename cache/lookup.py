"""Planning a restore: the deepest cached state a prompt can start from.

A state at position P is restorable when the blocks 0 .. P//B - 1 are cached and
    - a hybrid model (recurrent layers can't be cut): a snapshot at exactly P;
    - attention only (KV can be cut anywhere): P is a block boundary, or some entry
      after block P//B - 1 (a snapshot's partial page, or another prompt's block)
      starts with the prompt's tokens up to P; its page is cut to those tokens.
Hashes find candidates; the stored tokens are compared before anything is
planned, so a hash collision can't serve another prompt's state.

The caller may hold the first blocks already (device pages of a shared prefix,
their tokens checked by the caller): they cost nothing to load, need not be in
the store at all, and are not listed piece by piece (a 256K-token prompt on the
device is 16K blocks). The keys come from the caller's KeyChain, hashed once per
request; snapshots are searched from the deepest block down, so planning a
question after a long context costs what the question does, not the context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple, Protocol

import torch

from ckptd.cache.entry import BLOCK, SNAPSHOT, EntryMeta
from ckptd.cache.keys import KeyChain, KeyContext, snapshot_key
from ckptd.cache.snapshot import Snapshot

DEVICE, HOST, DISK, REMOTE = "device", "host", "disk", "remote"
_SLOWEST_FIRST = (REMOTE, DISK, HOST, DEVICE)


class IndexView(Protocol):
    """What planning reads: entries of every tier, RAM first."""

    def find_many(self, keys: Sequence[bytes]) -> list[tuple[EntryMeta, str] | None]: ...

    def children_after(self, parent: bytes) -> list[tuple[bytes, EntryMeta, str]]: ...

    def has_snapshots(self, parent: bytes) -> bool:
        """Whether some snapshot names this parent."""
        ...

    # A view may also offer run_after(block, end) -> a run of the remote's blocks from
    # `block` up to at most `end` (cache/remote/run.py), or None: the blocks a fresh
    # daemon's plan reads, found by range instead of key by key.


class PieceRef(NamedTuple):   # a tuple: a long plan makes ~1,000 of them per request
    key: bytes
    kind: str          # BLOCK or SNAPSHOT
    tier: str          # HOST, DISK or REMOTE
    nbytes: int        # bytes to move: logical in RAM, stored (compressed) elsewhere
    position: int      # tokens covered by the state this piece was taken from


class Blocks(Sequence):
    """A plan's stored blocks, in prompt order: `refs` (pieces of any tier), then `run`
    (the remote's blocks after them, held by range: cache/remote/run.py). Indexing makes
    a run block's piece when asked for; what a restore reads in bulk (bytes by tier,
    ranges, the load) reads the run as a whole."""

    __slots__ = ("refs", "run")

    def __init__(self, refs=(), run=None) -> None:
        self.refs: list[PieceRef] = list(refs)
        self.run = run if run is not None and len(run) else None

    def __len__(self) -> int:
        return len(self.refs) + (len(self.run) if self.run is not None else 0)

    def __getitem__(self, i):
        n, nr = len(self), len(self.refs)
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if start or step != 1:
                return [self[j] for j in range(start, stop, step)]
            return Blocks(self.refs[:stop]) if stop <= nr else \
                Blocks(self.refs, self.run.head(stop - nr))
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("plan block index out of range")
        return self.refs[i] if i < nr else self.run.ref(i - nr)

    def __iter__(self):
        yield from self.refs
        if self.run is not None:
            yield from self.run.refs()

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"Blocks({len(self.refs)} pieces, run of {len(self.run or ())})"

    def tier_counts(self) -> list[tuple[str, int]]:
        """(tier, blocks) in order: a piece's tier once each, the run's once."""
        out = [(p.tier, 1) for p in self.refs]
        return out + [(REMOTE, len(self.run))] if self.run is not None else out


@dataclass
class RestorePlan:
    position: int                      # tokens the restored state covers
    blocks: Blocks                     # stored blocks device_blocks .. position // B - 1
                                       # (a list of pieces is taken as one)
    snapshot: PieceRef | None          # the state at `position`; for attention-only
                                       # models it may be taken later (snapshot.position >
                                       # position): its partial page is then cut
    tokens: list[int] = field(repr=False, default_factory=list)   # the prompt
    ctx: KeyContext = field(repr=False, default_factory=KeyContext)
    device_blocks: int = 0             # leading blocks the caller maps from its device pages
    shared: int = 0                    # prompt tokens that cached entries share: where
                                       # the prompt parts from what is cached
    remote: Any = field(repr=False, default=None)
                                       # the remote's pieces: what and where they are
                                       # (cache/remote/finder.py: Found)
    _by_tier: dict | None = field(repr=False, default=None, compare=False)
    _rounds: int | None = field(repr=False, default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.blocks, Blocks):
            self.blocks = Blocks(self.blocks)

    def pieces(self) -> list[PieceRef]:
        """What the store loads: the stored blocks, then the snapshot (a run's blocks
        made one by one: `listed` is what a restore reads)."""
        return [*self.blocks, *([self.snapshot] if self.snapshot else [])]

    def listed(self) -> list[PieceRef]:
        """The pieces held one by one: the blocks before the run, then the snapshot."""
        return [*self.blocks.refs, *([self.snapshot] if self.snapshot else [])]

    def bytes_by_tier(self) -> dict[str, int]:
        """Bytes to move from each store tier (device pages move nothing). A plan is not
        changed once made, and a restore prices it several times: counted once."""
        if self._by_tier is None:
            out: dict[str, int] = {}
            for p in self.listed():
                out[p.tier] = out.get(p.tier, 0) + p.nbytes
            if self.blocks.run is not None:
                out[REMOTE] = out.get(REMOTE, 0) + self.blocks.run.nbytes
            self._by_tier = out
        return dict(self._by_tier)

    def remote_rounds(self) -> int:
        """Request rounds reading the plan's remote pieces takes (counted once)."""
        if self._rounds is None:
            pieces = [p for p in self.listed() if p.tier == REMOTE]
            run = self.blocks.run
            self._rounds = self.remote.rounds(pieces, run) if self.remote is not None \
                else len(pieces) + len(run or ())
        return self._rounds

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_tier().values())

    @property
    def tier(self) -> str | None:
        """The slowest tier the plan reads from (None for an empty plan)."""
        tiers = {p.tier for p in self.listed()} | ({DEVICE} if self.device_blocks else set()) \
            | ({REMOTE} if self.blocks.run is not None else set())
        return next((t for t in _SLOWEST_FIRST if t in tiers), None)


@dataclass
class RestoredState:
    position: int
    pages: torch.Tensor | None                 # [position // B - first_block, *kv_shape()]
    snapshot: Snapshot | None
    ok: bool = True      # False: a piece failed; position is then the longest good prefix
    dropped: int = 0     # pieces that failed verification and were deleted
    tier: str | None = None
    first_block: int = 0  # blocks before this come from the caller's device pages: `pages`
                          # holds blocks first_block .. position // B - 1
    kept_from: int | None = None   # blocks kept_from .. position // B - 1 (the remote's
                          # run) are on their way into the store: a write-through the
                          # store's own puts wait for (WriteThrough.after)


def plan_restore(tokens: list[int], limit: int, chain: KeyChain, hybrid: bool,
                 view: IndexView, device_blocks: int = 0) -> RestorePlan:
    """The deepest restorable state of tokens[:limit]. chain: the prompt's block keys
    (at least limit // B of them); blocks 0 .. device_blocks - 1 are on the caller's
    device already (verified by the caller)."""
    B, ctx = chain.block_size, chain.ctx
    n_full = limit // B
    if len(chain) < n_full:
        raise ValueError(f"the key chain holds {len(chain)} blocks, the plan needs {n_full}")
    keys = chain.keys
    dev = min(device_blocks, n_full)
    wanted = keys[dev:n_full]
    blocks = _block_run(tokens, B, dev, wanted, view.find_many(wanted))
    depth = dev + len(blocks)
    run_after = getattr(view, "run_after", None)
    run = run_after(depth, n_full) if run_after is not None else None
    blocks = Blocks(blocks, run)
    depth = dev + len(blocks)
    shared = depth * B + _shared_after(tokens, chain, depth, view)
    if not hybrid:
        cut = _partial_page(tokens, limit, chain, depth, view)
        if cut is not None:
            return RestorePlan(depth * B + cut[0], blocks, cut[1], tokens, ctx, dev, shared)
        return RestorePlan(depth * B, blocks, None, tokens, ctx, dev, shared)
    for d in range(depth, -1, -1):
        parent = chain.parent(d)
        if not view.has_snapshots(parent):
            continue
        best: PieceRef | None = None
        for key, meta, tier in view.children_after(parent):
            r = len(meta.tokens)
            if meta.kind != SNAPSHOT or d * B + r > limit or r >= B or d * B + r == 0 \
                    or (best is not None and best.position >= d * B + r):
                continue
            tail = tokens[d * B:d * B + r]
            # The position restored is the meta's: it must be the one the key names,
            # and after images the M-RoPE position recorded the one the prompt has there.
            if meta.tokens == tail and meta.position == d * B + r \
                    and _rope_matches(meta, ctx) \
                    and snapshot_key(parent, tail, d, B, ctx) == key:
                best = _ref(key, meta, tier)
        if best is not None:
            return RestorePlan(best.position, blocks[:max(0, d - dev)], best, tokens, ctx,
                               min(dev, d), shared)
    return RestorePlan(0, [], None, tokens, ctx, shared=shared)


def _block_run(tokens: list[int], B: int, dev: int, keys: Sequence[bytes],
               hits: list[tuple[EntryMeta, str] | None]) -> list[PieceRef]:
    """The blocks dev, dev + 1, .. found (keys, hits) as refs, up to the first that is
    missing or is not the prompt's block there (its kind, position or tokens). A 32K
    prompt is ~2,000 blocks: the run is checked at once (one compare of its kinds, one
    of its positions, one of its token lists against the prompt's), block by block only
    to find where a mismatch is."""
    n = hits.index(None) if None in hits else len(hits)
    metas = list(map(itemgetter(0), hits[:n]))        # C loops: ~15,000 blocks at 250K
    end = (dev + n) * B
    if list(map(attrgetter("kind"), metas)) == [BLOCK] * n \
            and list(map(attrgetter("position"), metas)) == list(range((dev + 1) * B, end + 1, B)) \
            and list(map(attrgetter("tokens"), metas)) == list(map(tokens.__getitem__, map(
                slice, range(dev * B, end, B), range((dev + 1) * B, end + 1, B)))):
        new, host = tuple.__new__, HOST     # PieceRef(...) is a Python call: 4x the time
        return [new(PieceRef, (k, m.kind, t, m.logical_bytes if t == host else m.stored_bytes,
                               m.position)) for k, (m, t) in zip(keys, hits[:n])]
    blocks: list[PieceRef] = []
    for i, (key, (meta, tier)) in enumerate(zip(keys[:n], hits[:n]), dev):
        if meta.kind != BLOCK or meta.position != (i + 1) * B \
                or meta.tokens != tokens[i * B:(i + 1) * B]:
            break
        blocks.append(_ref(key, meta, tier))
    return blocks


def _rope_matches(meta: EntryMeta, ctx: KeyContext) -> bool:
    """A snapshot's recorded next M-RoPE position is the prompt's there (a state taken
    with the wrong position would drift from the KV it sits on)."""
    want = ctx.next_position(meta.position)
    return (meta.next_position if meta.next_position is not None else meta.position) == want


def _shared_after(tokens: list[int], chain: KeyChain, depth: int, view: IndexView) -> int:
    """How many of the prompt's tokens after block `depth` some entry after that block
    (another prompt's next block, a snapshot's tail) starts with."""
    B = chain.block_size
    want = tokens[depth * B:(depth + 1) * B]
    best = 0
    for _, meta, _ in view.children_after(chain.parent(depth)):
        have, m = meta.tokens, 0
        while m < min(len(have), len(want)) and have[m] == want[m]:
            m += 1
        best = max(best, m)
    return best


def _partial_page(tokens: list[int], limit: int, chain: KeyChain, depth: int,
                  view: IndexView) -> tuple[int, PieceRef] | None:
    """Attention only: the entry after the deepest block that covers most of the prompt's
    next tokens, as (tokens it covers, ref). A snapshot whose whole tail matches (key
    checked) wins ties: it may carry the last logits. A page is cut to a prefix only
    when tokens alone define it (no positions or extras on either side)."""
    B, ctx = chain.block_size, chain.ctx
    parent = chain.parent(depth)
    want = tokens[depth * B:min(limit, (depth + 1) * B)]
    best: tuple[int, bool, PieceRef] | None = None
    for key, meta, tier in view.children_after(parent):
        have = meta.tokens
        m = 0
        while m < min(len(have), len(want)) and have[m] == want[m]:
            m += 1
        whole = meta.kind == SNAPSHOT and m == len(have) and \
            meta.position == depth * B + m and _rope_matches(meta, ctx) \
            and snapshot_key(parent, have, depth, B, ctx) == key
        if not whole and not (m and meta.plain and ctx.plain(depth, B)):
            continue
        if best is None or (m, whole) > best[:2]:
            best = (m, whole, _ref(key, meta, tier))
    return None if best is None else (best[0], best[2])


def _ref(key: bytes, meta: EntryMeta, tier: str) -> PieceRef:
    nbytes = meta.logical_bytes if tier == HOST else meta.stored_bytes
    return PieceRef(key, meta.kind, tier, nbytes, meta.position)

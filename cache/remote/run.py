"""The remote's blocks of one prompt as a run: consecutive blocks a state's head names,
held as the head's frames rather than as an object a block.

A 250K-token prompt is ~15,600 blocks in ~120 frames. Made one Python object a block
(a meta, a location, a piece of the plan, a page's entry in the load), they were most
of a fresh daemon's restore on two cores: the planning held the interpreter lock the
transfer's threads wait on. A Run answers the plan's questions (how many blocks, their
bytes, their ranges) from its spans, and makes a block's piece or meta only when one is
asked for by index (a failed load's report, the blocks kept in LMDB afterwards).

Every block of a run is the prompt's own by construction: its key is the prompt's
chain key, its tokens the prompt's, so planning has nothing to compare; its bytes are
checked as they are decoded (checksum, then the page's shape), as any remote value.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from typing import NamedTuple

from ckptd.cache.entry import BLOCK, BlockMeta
from ckptd.cache.keys import KeyChain
from ckptd.cache.lookup import REMOTE, PieceRef
from ckptd.cache.remote.frames import Frame
from ckptd.cache.remote.ranges import Loc


class Span(NamedTuple):
    """Consecutive blocks stored together: a frame of a framed segment, or one value of
    a segment of the old layout (blocks 1, frame None)."""
    first: int               # its first block, in the prompt
    blocks: int              # blocks it holds (a frame's whole count, used or not)
    loc: Loc                 # its bytes
    frame: Frame | None

    @property
    def stored(self) -> int:
        """A block's share of the stored bytes (what planning prices a block at)."""
        return self.loc.length // self.blocks


class Run:
    """Blocks lo .. hi - 1 of the prompt, all on the remote, in spans (sorted, end to
    end; a span may start before lo or end after hi)."""

    def __init__(self, chain: KeyChain, tokens: list[int], spans: list[Span], lo: int,
                 hi: int, fingerprint: str, block_bytes: int, plain, made: float) -> None:
        """plain(b): whether block b's tokens alone define its page (KeyContext.plain);
        made: the time its metas are dated (time.time())."""
        self.chain, self.tokens, self.fp = chain, tokens, fingerprint
        self.block_bytes, self.plain, self.made = block_bytes, plain, made
        self.lo, self.hi = lo, hi
        starts = [s.first for s in spans]
        a = max(bisect_right(starts, lo) - 1, 0)
        b = bisect_right(starts, hi - 1) if hi > lo else a
        self.spans, self.starts = spans[a:b], starts[a:b]

    def __len__(self) -> int:
        return self.hi - self.lo

    def cut(self, lo: int, hi: int) -> Run:
        """The same blocks from lo to hi (within this run's)."""
        lo, hi = max(lo, self.lo), min(hi, self.hi)
        return Run(self.chain, self.tokens, self.spans, lo, max(lo, hi), self.fp,
                   self.block_bytes, self.plain, self.made)

    def head(self, n: int) -> Run:
        """Its first n blocks."""
        return self.cut(self.lo, self.lo + n)

    def span_of(self, b: int) -> Span:
        return self.spans[bisect_right(self.starts, b) - 1]

    @property
    def nbytes(self) -> int:
        """Stored bytes of its blocks, as planning counts them."""
        return sum(s.stored * (min(s.first + s.blocks, self.hi) - max(s.first, self.lo))
                   for s in self.spans)

    def locs(self) -> list[Loc]:
        """Where its bytes are, a span once."""
        return [s.loc for s in self.spans]

    def keys(self) -> list[bytes]:
        return self.chain.keys[self.lo:self.hi]

    def blocks_of(self, s: Span) -> range:
        """The blocks of span s this run holds."""
        return range(max(s.first, self.lo), min(s.first + s.blocks, self.hi))

    def ref(self, i: int) -> PieceRef:
        """Its i-th block as a plan's piece."""
        b = self.lo + i
        return PieceRef(self.chain.keys[b], BLOCK, REMOTE, self.span_of(b).stored,
                        (b + 1) * self.chain.block_size)

    def refs(self) -> Iterator[PieceRef]:
        return (self.ref(i) for i in range(len(self)))

    def meta(self, b: int) -> BlockMeta:
        """Block b's meta, as the store keeps it (the head implies every field)."""
        B = self.chain.block_size
        return BlockMeta(BLOCK, self.chain.parent(b), (b + 1) * B,
                         self.tokens[b * B:(b + 1) * B], self.fp, self.span_of(b).stored,
                         self.block_bytes, self.plain(b, B), self.made)

    def index(self) -> dict[bytes, int]:
        """key -> block, for the blocks' per-key views (made on demand: failures, tests)."""
        return dict(zip(self.keys(), range(self.lo, self.hi)))

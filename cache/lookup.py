"""Planning a restore: the deepest cached state a prompt can start from.

A state at position P is restorable when the blocks 0 .. P//B - 1 are cached and
    - a hybrid model (recurrent layers can't be cut): a snapshot at exactly P;
    - attention only (KV can be cut anywhere): P is a block boundary, or some entry
      after block P//B - 1 (a snapshot's partial page, or another prompt's block)
      starts with the prompt's tokens up to P; its page is cut to those tokens.
Hashes find candidates; the stored tokens are compared before anything is
planned, so a hash collision can't serve another prompt's state.

The caller may hold the first blocks already (device pages of a shared prefix,
their tokens checked by the caller): they count as blocks of the "device" tier,
cost nothing to load, and need not be in the store at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch

from ckptd.cache.entry import BLOCK, SNAPSHOT, EntryMeta
from ckptd.cache.keys import KeyContext, block_keys, snapshot_key

DEVICE, HOST, DISK = "device", "host", "disk"
_SLOWEST_FIRST = (DISK, HOST, DEVICE)


class IndexView(Protocol):
    """What planning reads: entries of every tier, RAM first."""

    def find_many(self, keys: Sequence[bytes]) -> list[tuple[EntryMeta, str] | None]: ...

    def children_after(self, parent: bytes) -> list[tuple[bytes, EntryMeta, str]]: ...

    def with_snapshots(self, parents: Sequence[bytes]) -> set[bytes]:
        """The parents among these that some snapshot names."""
        ...


class PieceRef(NamedTuple):   # a tuple: a long plan makes ~1,000 of them per request
    key: bytes
    kind: str          # BLOCK or SNAPSHOT
    tier: str          # DEVICE, HOST or DISK
    nbytes: int        # bytes to move: logical in RAM, stored (compressed) on disk, 0 on device
    position: int      # tokens covered by the state this piece was taken from


@dataclass
class RestorePlan:
    position: int                      # tokens the restored state covers
    blocks: list[PieceRef]             # blocks 0 .. position // B - 1
    snapshot: PieceRef | None          # the state at `position`; for attention-only
                                       # models it may be taken later (snapshot.position >
                                       # position): its partial page is then cut
    tokens: list[int] = field(repr=False, default_factory=list)   # the prompt, up to the limit
    ctx: KeyContext = field(repr=False, default_factory=KeyContext)
    device_blocks: int = 0             # leading blocks the caller maps from its device pages

    def pieces(self) -> list[PieceRef]:
        return [*self.blocks, *([self.snapshot] if self.snapshot else [])]

    def to_read(self) -> list[PieceRef]:
        """The pieces the store loads: all but the leading device blocks."""
        return self.pieces()[self.device_blocks:]

    def bytes_by_tier(self) -> dict[str, int]:
        """Bytes to move from each store tier (device pages move nothing)."""
        out: dict[str, int] = {}
        for p in self.to_read():
            out[p.tier] = out.get(p.tier, 0) + p.nbytes
        return out

    @property
    def total_bytes(self) -> int:
        return sum(p.nbytes for p in self.pieces())

    @property
    def tier(self) -> str | None:
        """The slowest tier the plan reads from (None for an empty plan)."""
        tiers = {p.tier for p in self.pieces()}
        return next((t for t in _SLOWEST_FIRST if t in tiers), None)


@dataclass
class RestoredState:
    position: int
    pages: torch.Tensor | None                 # [position // B, *spec.kv_shape()]
    snapshot: dict[str, torch.Tensor] | None   # conv, ssm, kv (partial page), logits
    ok: bool = True      # False: a piece failed; the fields hold the longest good prefix
    dropped: int = 0     # pieces that failed verification and were deleted
    tier: str | None = None
    first_block: int = 0  # blocks before this come from the caller's device pages: `pages`
                          # holds blocks first_block .. position // B - 1


def plan_restore(tokens: list[int], limit: int, root: bytes, block_size: int, hybrid: bool,
                 ctx: KeyContext, view: IndexView, device_blocks: int = 0) -> RestorePlan:
    """The deepest restorable state of tokens[:limit]; blocks 0 .. device_blocks - 1
    are on the caller's device already (verified by the caller)."""
    B = block_size
    tokens = tokens[:limit]
    keys = block_keys(root, tokens, B, ctx)
    dev = min(device_blocks, len(keys))
    blocks = [PieceRef(k, BLOCK, DEVICE, 0, (i + 1) * B) for i, k in enumerate(keys[:dev])]
    for i, (key, found) in enumerate(zip(keys[dev:], view.find_many(keys[dev:])), dev):
        if found is None or found[0].kind != BLOCK or found[0].position != (i + 1) * B \
                or found[0].tokens != tokens[i * B:(i + 1) * B]:
            break
        blocks.append(_ref(key, *found))
    depth = len(blocks)
    if not hybrid:
        cut = _partial_page(tokens, keys, root, B, depth, ctx, view)
        if cut is not None:
            return RestorePlan(depth * B + cut[0], blocks, cut[1], tokens, ctx, dev)
        return RestorePlan(depth * B, blocks, None, tokens, ctx, dev)
    parents = [root, *keys[:depth]]                 # parents[d]: the key before block d
    with_snaps = view.with_snapshots(parents)
    for d in range(depth, -1, -1):
        parent = parents[d]
        if parent not in with_snaps:
            continue
        best: PieceRef | None = None
        for key, meta, tier in view.children_after(parent):
            r = len(meta.tokens)
            if meta.kind != SNAPSHOT or d * B + r > limit or r >= B or d * B + r == 0 \
                    or (best is not None and best.position >= d * B + r):
                continue
            tail = tokens[d * B:d * B + r]
            # The position restored is the meta's: it must be the one the key names.
            if meta.tokens == tail and meta.position == d * B + r \
                    and snapshot_key(parent, tail, d, B, ctx) == key:
                best = _ref(key, meta, tier)
        if best is not None:
            return RestorePlan(best.position, blocks[:d], best, tokens, ctx, min(dev, d))
    return RestorePlan(0, [], None, tokens, ctx)


def _partial_page(tokens: list[int], keys: list[bytes], root: bytes, B: int, depth: int,
                  ctx: KeyContext, view: IndexView) -> tuple[int, PieceRef] | None:
    """Attention only: the entry after the deepest block that covers most of the prompt's
    next tokens, as (tokens it covers, ref). A snapshot whose whole tail matches (key
    checked) wins ties: it may carry the last logits. A page is cut to a prefix only
    when tokens alone define it (no positions or extras on either side)."""
    parent = keys[depth - 1] if depth else root
    want = tokens[depth * B:(depth + 1) * B]
    best: tuple[int, bool, PieceRef] | None = None
    for key, meta, tier in view.children_after(parent):
        have = meta.tokens
        m = 0
        while m < min(len(have), len(want)) and have[m] == want[m]:
            m += 1
        whole = meta.kind == SNAPSHOT and m == len(have) and \
            meta.position == depth * B + m and snapshot_key(parent, have, depth, B, ctx) == key
        if not whole and not (m and meta.plain and ctx.plain(depth, B)):
            continue
        if best is None or (m, whole) > best[:2]:
            best = (m, whole, _ref(key, meta, tier))
    return None if best is None else (best[0], best[2])


def _ref(key: bytes, meta: EntryMeta, tier: str) -> PieceRef:
    nbytes = meta.logical_bytes if tier == HOST else meta.stored_bytes
    return PieceRef(key, meta.kind, tier, nbytes, meta.position)

"""Planning a restore: the deepest cached state a prompt can start from.

A state at position P is restorable when the blocks 0 .. P//B - 1 are cached and
either P is a block boundary of a model without recurrent layers, or a snapshot
at exactly P is cached (its tail tokens after the last full block included).
Hashes find candidates; the stored tokens are compared before anything is
planned, so a hash collision can't serve another prompt's state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from cache.entry import BLOCK, EntryMeta
from cache.keys import KeyContext, block_keys, snapshot_key

HOST, DISK = "host", "disk"

Find = Callable[[bytes], "tuple[EntryMeta, str] | None"]
Snapshots = Callable[[bytes], "list[tuple[bytes, EntryMeta, str]]"]


@dataclass(frozen=True)
class PieceRef:
    key: bytes
    kind: str          # BLOCK or SNAPSHOT
    tier: str          # HOST or DISK
    nbytes: int        # bytes to move: logical in RAM, stored (compressed) on disk
    position: int      # tokens covered once this piece is loaded


@dataclass
class RestorePlan:
    position: int                      # tokens the restored state covers
    blocks: list[PieceRef]             # blocks 0 .. position // B - 1
    snapshot: PieceRef | None          # the state at exactly `position`, when needed
    tokens: list[int] = field(repr=False, default_factory=list)   # the prompt, up to the limit
    ctx: KeyContext = field(repr=False, default_factory=KeyContext)

    def pieces(self) -> list[PieceRef]:
        return [*self.blocks, *([self.snapshot] if self.snapshot else [])]

    def bytes_by_tier(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.pieces():
            out[p.tier] = out.get(p.tier, 0) + p.nbytes
        return out

    @property
    def total_bytes(self) -> int:
        return sum(p.nbytes for p in self.pieces())

    @property
    def tier(self) -> str | None:
        """The slowest tier the plan reads from (None for an empty plan)."""
        tiers = self.bytes_by_tier()
        return DISK if DISK in tiers else (HOST if tiers else None)


@dataclass
class RestoredState:
    position: int
    pages: torch.Tensor | None                 # [position // B, *spec.kv_shape()]
    snapshot: dict[str, torch.Tensor] | None   # conv, ssm, kv (partial page), logits
    ok: bool = True      # False: a piece failed; the fields hold the longest good prefix
    dropped: int = 0     # pieces that failed verification and were deleted
    tier: str | None = None


def plan_restore(tokens: list[int], limit: int, root: bytes, block_size: int, hybrid: bool,
                 ctx: KeyContext, find: Find, snapshots_after: Snapshots) -> RestorePlan:
    """The deepest restorable state of tokens[:limit]. find(key) gives an entry's meta
    and tier; snapshots_after(parent) the snapshots whose parent is that key."""
    B = block_size
    tokens = tokens[:limit]
    keys = block_keys(root, tokens, B, ctx)
    blocks: list[PieceRef] = []
    for i, key in enumerate(keys):
        found = find(key)
        if found is None or found[0].kind != BLOCK or found[0].tokens != tokens[i * B:(i + 1) * B]:
            break
        blocks.append(_ref(key, *found))
    depth = len(blocks)
    for d in range(depth, -1, -1):
        parent = keys[d - 1] if d else root
        best: tuple[int, PieceRef] | None = None
        for key, meta, tier in snapshots_after(parent):
            r = len(meta.tokens)
            pos = d * B + r
            if pos == 0 or pos > limit or r >= B or (best is not None and r <= best[0]):
                continue
            tail = tokens[d * B:pos]
            if meta.tokens != tail or snapshot_key(parent, tail, d, B, ctx) != key:
                continue
            best = (r, _ref(key, meta, tier))
        if best is not None:
            return RestorePlan(best[1].position, blocks[:d], best[1], tokens, ctx)
        if not hybrid:
            break       # blocks alone reach depth * B; only a snapshot after them does better
    if hybrid:
        return RestorePlan(0, [], None, tokens, ctx)
    return RestorePlan(depth * B, blocks, None, tokens, ctx)


def _ref(key: bytes, meta: EntryMeta, tier: str) -> PieceRef:
    nbytes = meta.logical_bytes if tier == HOST else meta.stored_bytes
    return PieceRef(key, meta.kind, tier, nbytes, meta.position)

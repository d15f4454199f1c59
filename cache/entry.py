"""What the index records about one cached value (JSON in LMDB's meta database)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

BLOCK, SNAPSHOT = "block", "snapshot"
# Why a snapshot was taken: at a snapshot_interval boundary of a prefill, at the end of
# a prompt or an answer, where prompts part from a shared prefix, or a few tokens before
# a raw prompt's end, where the next prompt over the same text is likely to part (a
# tail: cache/checkpoints.py). Interval ones are thinned and shed first; tails are
# written like branch points but thinned once the path's end has moved past them, and
# dropped when a branch point replaces them; "" is a block's (or a snapshot stored
# before roles existed).
INTERVAL, END, BRANCH, TAIL = "interval", "end", "branch", "tail"
ROLES = ("", INTERVAL, END, BRANCH, TAIL)
TAIL_OFFSETS = (64, 256, 1024)   # tokens before a raw prompt's end: its tail snapshots
TAIL_WINDOW = max(TAIL_OFFSETS)


@dataclass
class EntryMeta:
    kind: str                 # BLOCK (one KV page) or SNAPSHOT (the state at one position)
    parent: bytes             # key of the previous block, or the root key
    position: int             # tokens covered from the start: (i+1)*B for block i, P for a snapshot
    tokens: list[int]         # a block's B tokens, or a snapshot's tail after its parent
    fingerprint: str
    stored_bytes: int = 0     # encoded (compressed) size; 0 until the writer encodes it
    logical_bytes: int = 0    # uncompressed tensor bytes
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    hits: int = 0
    pinned: bool = False
    plain: bool = True        # keyed without positions or extras: its tokens alone define it
    role: str = ""            # a snapshot's: INTERVAL, END, BRANCH or TAIL
    # a snapshot after images: the M-RoPE position its next token takes (position counts
    # tokens, which the KV pages and recurrent layers go by); None: equal to position
    next_position: int | None = None

    @property
    def keep_first(self) -> bool:
        """A snapshot worth more than an interval one: kept longer when thinning, shed
        last when the writer falls behind."""
        return self.role in (END, BRANCH)

    @property
    def shed_last(self) -> bool:
        """Written through when the writer falls behind (shed only after every interval
        snapshot): the end, branch and tail snapshots."""
        return self.role in (END, BRANCH, TAIL)

    @property
    def has_block_parent(self) -> bool:
        """False when the parent is a root key (block 0, or a snapshot inside block 0)."""
        return self.position != len(self.tokens)

    def to_bytes(self) -> bytes:
        d = asdict(self)
        d["parent"] = self.parent.hex()
        if self.next_position is None:      # text only: the meta as before images
            del d["next_position"]
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> EntryMeta:
        """ValueError when the bytes are not a well-formed meta (a damaged file)."""
        try:
            d = json.loads(bytes(data))
            d["parent"] = bytes.fromhex(d["parent"])
            meta = cls(**d)
        except (TypeError, KeyError, AttributeError) as e:
            raise ValueError(f"not an entry meta: {e}") from None
        meta._check()
        return meta

    def _check(self) -> None:
        # The meta has no checksum of its own: what the lookup trusts is checked here,
        # so a flipped byte reads as a damaged entry, never as a different state.
        ints = (self.position, self.stored_bytes, self.logical_bytes, self.hits)
        if self.kind not in (BLOCK, SNAPSHOT) or len(self.parent) != 16 \
                or not all(type(v) is int and v >= 0 for v in ints) \
                or not isinstance(self.tokens, list) \
                or not all(type(t) is int and t >= 0 for t in self.tokens) \
                or not 0 < self.position or len(self.tokens) > self.position \
                or (self.kind == BLOCK and not self.tokens) \
                or not isinstance(self.fingerprint, str) \
                or not all(type(b) is bool for b in (self.pinned, self.plain)) \
                or self.role not in ROLES \
                or not (self.next_position is None
                        or (type(self.next_position) is int and self.next_position >= 0)) \
                or not all(isinstance(t, (int, float)) for t in (self.created, self.last_used)):
            raise ValueError("not an entry meta: a field is out of range")


class BlockMeta(NamedTuple):
    """A block's meta as a remote state's head implies it (cache/remote/finder.py): the
    fields planning reads, made by the ten thousand for a long restore at a fraction of
    an EntryMeta's cost (a dataclass call a block was ~1/10 of a 250K restore); entry()
    is the EntryMeta the store keeps."""
    kind: str
    parent: bytes
    position: int
    tokens: list[int]
    fingerprint: str
    stored_bytes: int
    logical_bytes: int
    plain: bool
    created: float

    def entry(self) -> EntryMeta:
        return EntryMeta(self.kind, self.parent, self.position, self.tokens, self.fingerprint,
                         self.stored_bytes, self.logical_bytes, self.created, self.created,
                         plain=self.plain)

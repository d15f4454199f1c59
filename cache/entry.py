"""What the index records about one cached value (stored as JSON in LMDB's meta db)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

BLOCK, SNAPSHOT = "block", "snapshot"


@dataclass
class EntryMeta:
    kind: str                 # "block" (one KV page) or "snapshot" (recurrent state at a position)
    parent: str               # hex key of the previous block (or the root)
    position: int             # tokens covered from the start: (i+1)*B for block i, P for a snapshot
    tokens: list[int]         # the block's tokens, or a snapshot's tail after its parent
    fingerprint: str
    stored_bytes: int = 0
    logical_bytes: int = 0
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    hits: int = 0
    pinned: bool = False

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> EntryMeta:
        return cls(**json.loads(bytes(data)))

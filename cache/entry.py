"""What the index records about one cached value (JSON in LMDB's meta database)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

BLOCK, SNAPSHOT = "block", "snapshot"


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

    @property
    def has_block_parent(self) -> bool:
        """False when the parent is a root key (block 0, or a snapshot inside block 0)."""
        return self.position != len(self.tokens)

    def to_bytes(self) -> bytes:
        d = asdict(self)
        d["parent"] = self.parent.hex()
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> EntryMeta:
        d = json.loads(bytes(data))
        d["parent"] = bytes.fromhex(d["parent"])
        return cls(**d)

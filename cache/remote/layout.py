"""Where cached state lives in an S3 bucket: segments of blocks and state objects.

Names, under `s3://BUCKET/PREFIX`, for one model (its fingerprint) and one grid of
G blocks a segment:

    ROOT = PREFIX/ckptd/v{FORMAT_VERSION}/{fingerprint}/g{G}/
    ROOT/seg/{start parent}/{last key}          blocks start .. last of one chain
    ROOT/state/{cell parent}/{P}-{key}          a restorable state at position P

Keys are cache keys in hex (cache/keys.py): a block's key hashes its whole prefix
under the model, format, block size and salt, so a name made of keys is the
content's address, and a daemon only ever names objects from its own keys (salt
isolation needs nothing in the path).

Segments (segment.py): the blocks of a chain are cut at fixed absolute positions,
every G blocks (G = segment bytes / a block's bytes), so two contexts sharing a
prefix share the segment objects of every cell the prefix fills. A segment is named
by the key before its first block (the root key for block 0) and the key of its
last: a full cell is [cG, (c+1)G); the part of a cell at the end of a chain (where a
context ends) may be one or a few shorter segments, cut where earlier uploads ended,
so a chat that grows a turn at a time puts only its new blocks.

States (state.py): the state at position P (a snapshot: recurrent state, the partial
page, maybe the last logits) is one object, listed under the cell of its last full
block (cell c = (P // B) // G, named by the key before block cG). Its head names the
segments that hold blocks 0 .. P//B - 1 with every block's offset; the snapshot's
value follows. A lookup LISTs the cells of a prompt, deepest first, and recognises
its own states by key; one ranged GET of a head then plans the whole restore.

Framed layout (frames.py): a segment of frames of raw pages, and the states that
name such segments, are named as above with ".f" after the name: a daemon of the
layout before it (segments of LMDB values) never lists them, and reads what it wrote
itself as before; a daemon of this one writes framed objects and reads both.

Objects are immutable and written conditionally (If-None-Match: *): a state only
after every segment it names (state objects are the index, written last), so a
daemon killed mid-upload leaves segments no state names (taken by `ckptd inspect
--remote gc` after a grace period), never a state naming a missing segment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ckptd.cache.keys import FORMAT_VERSION, KEY_BYTES

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_HEX = 2 * KEY_BYTES
SEGMENT, STATE = "segment", "state"
FRAMED = ".f"        # after the name of an object of the framed layout (frames.py)


def framed(name: str) -> bool:
    """Whether an object is of the framed layout (its segments are frames of pages)."""
    return name.endswith(FRAMED)


@dataclass(frozen=True)
class RemoteURL:
    bucket: str
    prefix: str = ""          # no leading or trailing slash

    @classmethod
    def parse(cls, url: str) -> RemoteURL:
        """s3://bucket or s3://bucket/some/prefix; ValueError naming what is wrong."""
        text = str(url).strip()
        if not text.startswith("s3://"):
            raise ValueError(f"--remote must be s3://BUCKET[/PREFIX], got {url!r}")
        bucket, _, prefix = text[len("s3://"):].partition("/")
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise ValueError(f"--remote: {bucket!r} is not an S3 bucket name (3-63 "
                             "lowercase letters, digits, dots and hyphens)")
        prefix = prefix.strip("/")
        if "//" in prefix or any(c in prefix for c in "\\\0\n\r"):
            raise ValueError(f"--remote: bad prefix {prefix!r}")
        return cls(bucket, prefix)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


class Layout:
    """Object names of one model's state under one URL, on one grid."""

    def __init__(self, url: RemoteURL, fingerprint: str, grid: int) -> None:
        if not fingerprint or "/" in fingerprint:
            raise ValueError(f"not a model fingerprint: {fingerprint!r}")
        if grid < 1:
            raise ValueError(f"a segment holds at least one block, got {grid}")
        self.url, self.fp, self.grid = url, fingerprint, grid
        self.model_root = model_root(url, fingerprint)     # every grid, and the first layout
        self.root = f"{self.model_root}g{grid}/"

    def segment(self, start_parent: bytes, last: bytes, framed: bool = True) -> str:
        return f"{self.root}seg/{start_parent.hex()}/{last.hex()}{FRAMED if framed else ''}"

    def states_of(self, cell_parent: bytes) -> str:
        """The prefix a LIST reads to find the states of one cell of one prefix."""
        return f"{self.root}state/{cell_parent.hex()}/"

    def state(self, cell_parent: bytes, position: int, key: bytes, framed: bool = True) -> str:
        return f"{self.states_of(cell_parent)}{position}-{key.hex()}{FRAMED if framed else ''}"

    def relative(self, name: str) -> str:
        """A name as a state's head keeps it: below ROOT (a bucket prefix may move)."""
        if not name.startswith(self.root):
            raise ValueError(f"{name!r} is not under {self.root!r}")
        return name[len(self.root):]

    def absolute(self, relative: str) -> str:
        return self.root + relative

    def parse(self, name: str) -> tuple[str, bytes, bytes, int] | None:
        """(SEGMENT, start parent, last key, 0) or (STATE, cell parent, key, position)
        of a name under ROOT; None for anything else."""
        if not name.startswith(self.root):
            return None
        parts = name[len(self.root):].split("/")
        if parts[-1].endswith(FRAMED):
            parts[-1] = parts[-1][:-len(FRAMED)]
        if len(parts) != 3 or len(parts[1]) != _HEX:
            return None
        try:
            if parts[0] == "seg" and len(parts[2]) == _HEX:
                return SEGMENT, bytes.fromhex(parts[1]), bytes.fromhex(parts[2]), 0
            if parts[0] == "state":
                pos, _, key = parts[2].partition("-")
                if len(key) == _HEX and pos.isdigit() and int(pos) > 0:
                    return STATE, bytes.fromhex(parts[1]), bytes.fromhex(key), int(pos)
        except ValueError:
            return None
        return None


def formats_root(url: RemoteURL) -> str:
    """Everything ckptd writes under a URL: one folder per format version below it."""
    return f"{url.prefix}/ckptd/" if url.prefix else "ckptd/"


def model_root(url: RemoteURL, fingerprint: str) -> str:
    return f"{formats_root(url)}v{FORMAT_VERSION}/{fingerprint}/"


def grid_for(segment_bytes: int, block_bytes: int) -> int:
    """Blocks a segment holds: as many as fit segment_bytes (at least one). Daemons
    that share a bucket share segments only on the same grid (it is in the names)."""
    return max(1, segment_bytes // block_bytes) if block_bytes > 0 else 1

"""The architecture named in a GGUF header, read without opening the tensors.

    read_architecture("model.gguf")   # "qwen35moe"

GGUF (v2, v3): magic "GGUF", u32 version, u64 tensor count, u64 key-value count, then
the key-value pairs (key: u64 length + UTF-8; u32 value type; value). The loader
checks the architecture first, so an unsupported file is refused before gguf's
reader maps it and builds its tensor index.
"""

from __future__ import annotations

import struct
from pathlib import Path

# value type -> struct format of one scalar; 8 is a string, 9 an array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_MAX_KV = 1 << 20          # more key-value pairs than any real file has: a corrupt count


def read_architecture(path: str | Path) -> str | None:
    """general.architecture, or None when the header has none; ValueError for a file
    that is not a GGUF or whose header is cut short."""
    path = Path(path)
    with open(path, "rb") as f:
        r = _Reader(f, path)
        if r.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (bad magic)")
        version = r.unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        r.unpack("<Q")                               # tensor count
        n_kv = r.unpack("<Q")
        if n_kv > _MAX_KV:
            raise ValueError(f"cannot read GGUF {path} (truncated or corrupt?): "
                             f"{n_kv} metadata entries")
        for _ in range(n_kv):
            key = r.string()
            vtype = r.unpack("<I")
            if key == "general.architecture" and vtype == 8:
                return r.string()
            r.skip_value(vtype)
    return None


class _Reader:
    def __init__(self, f, path: Path) -> None:
        self.f, self.path = f, path

    def read(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise ValueError(f"cannot read GGUF {self.path} (truncated or corrupt?): "
                             "the header ends early")
        return b

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > 1 << 30:
            raise ValueError(f"cannot read GGUF {self.path} (truncated or corrupt?): "
                             f"a {n}-byte string")
        return self.read(n).decode("utf-8", errors="replace")

    def skip_value(self, vtype: int) -> None:
        if vtype in _SCALARS:
            self.read(struct.calcsize("<" + _SCALARS[vtype]))
        elif vtype == 8:
            self.f.seek(self.unpack("<Q"), 1)
        elif vtype == 9:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item in _SCALARS:
                self.f.seek(count * struct.calcsize("<" + _SCALARS[item]), 1)
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise ValueError(f"cannot read GGUF {self.path} (truncated or corrupt?): "
                             f"unknown metadata type {vtype}")

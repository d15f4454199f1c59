"""The daemon's LoRA adapters: llama-server's flags, the global scales and what one
request runs with, and the cache namespace of an adapter set.

    --lora FILE[,FILE...]                 scale 1 (repeatable)
    --lora-scaled FILE:SCALE[,...]        or --lora-scaled FILE SCALE (older llama.cpp)
    --lora-init-without-apply             every scale starts at 0 (POST /lora-adapters)

Ids are the adapters' order on the command line. A request's `lora` list replaces the
global scales for it: adapters it does not name run at 0 (llama-server's rule).

The cache: a prefix computed with adapters is another state than the base model's, so
a request whose effective scales are not all 0 is keyed under a salt made of the
tenant's salt and a digest of the set of (adapter file digest, scale) of the adapters in use.
That salt is bytes starting with 0xFF, which no UTF-8 string (a user's cache_salt)
encodes to: no request can name another adapter set's entries. All scales 0 is the
base model exactly, and shares its entries.
"""

from __future__ import annotations

import hashlib
import math
import struct
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckptd.model.lora.adapter import Adapter

_LORA_SALT = b"\xfflora\x00"


@dataclass(frozen=True)
class LoraFile:
    path: str
    scale: float = 1.0


def parse_scaled(values: list[str]) -> list[LoraFile]:
    """--lora-scaled's values: ["FILE:SCALE,..."] or ["FILE", "SCALE"]; ValueError."""
    if len(values) == 2 and _is_number(values[1]):
        return [LoraFile(values[0], _scale(values[1], values[0]))]
    if len(values) != 1:
        raise ValueError("--lora-scaled takes FILE:SCALE[,FILE:SCALE...] or FILE SCALE")
    out = []
    for item in values[0].split(","):
        path, sep, scale = item.rpartition(":")
        if not sep or not path:
            raise ValueError(f"--lora-scaled: {item!r} is not FILE:SCALE")
        out.append(LoraFile(path, _scale(scale, path)))
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _scale(text: str, path: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"--lora-scaled: the scale of {path} is not a number: {text!r}") \
            from None
    if not math.isfinite(v):
        raise ValueError(f"--lora-scaled: the scale of {path} must be finite, got {text}")
    return v


def add_arguments(parser) -> None:
    parser.add_argument("--lora", action="append", default=[], metavar="FILE",
                        help="LoRA adapter (GGUF from llama.cpp's convert_lora_to_gguf.py, "
                             "or a PEFT folder) at scale 1; repeatable, or comma-separated")
    parser.add_argument("--lora-scaled", action="append", nargs="+", default=[],
                        metavar="FILE:SCALE", help="LoRA adapter with its scale: "
                        "FILE:SCALE[,...] or FILE SCALE; repeatable")
    parser.add_argument("--lora-init-without-apply", action="store_true", default=None,
                        help="load the adapters with scale 0 (set them with POST "
                             "/lora-adapters or a request's \"lora\")")


def from_args(args) -> dict:
    """ServeConfig's lora settings from the flags (in command-line order per flag)."""
    files = [LoraFile(p) for v in getattr(args, "lora", None) or [] for p in v.split(",") if p]
    for values in getattr(args, "lora_scaled", None) or []:
        files += parse_scaled(values)
    out: dict = {}
    if files:
        out["lora"] = tuple(files)
    if getattr(args, "lora_init_without_apply", None):
        out["lora_init_without_apply"] = True
    return out


class Adapters:
    """The loaded adapters (ids in order) and their global scales."""

    def __init__(self, adapters: list[Adapter], scales: list[float]) -> None:
        self.adapters = adapters
        self._scales = list(scales)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.adapters)

    def scales(self) -> tuple[float, ...]:
        with self._lock:
            return tuple(self._scales)

    def describe(self) -> list[dict]:
        """GET /lora-adapters: llama-server's entries."""
        return [{"id": i, "path": a.path, "scale": s, "task_name": "", "prompt_prefix": ""}
                for i, (a, s) in enumerate(zip(self.adapters, self.scales(), strict=True))]

    def set_global(self, scales: dict[int, float]) -> None:
        """POST /lora-adapters: the named ones get their scale, the others 0."""
        with self._lock:
            self._scales = [scales.get(i, 0.0) for i in range(len(self.adapters))]

    def effective(self, request: dict[int, float] | None) -> tuple[float, ...]:
        """A request's scales: its own list when it gives one (unnamed adapters at 0),
        else the global ones. () when no adapter is in use."""
        scales = self.scales() if request is None else \
            tuple(request.get(i, 0.0) for i in range(len(self.adapters)))
        return scales if any(scales) else ()

    def salt(self, tenant: str | None, scales: tuple[float, ...]) -> str | bytes | None:
        """The cache salt of a request with these effective scales (module docstring)."""
        if not any(scales):
            return tenant
        h = hashlib.blake2b(digest_size=16)
        # the set of (adapter bytes, scale): ids and their order do not matter to the sum
        for digest, s in sorted((self.adapters[i].digest, s) for i, s in enumerate(scales) if s):
            h.update(bytes.fromhex(digest) + struct.pack("<d", s))
        return _LORA_SALT + h.digest() + (tenant or "").encode()

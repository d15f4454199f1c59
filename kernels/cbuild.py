"""Building a C kernel file (kernels/*/cpu.c) once per machine, for ctypes.

The library is built with the system C compiler (`cc`, override with $CC) into
~/.cache/ckptd/kernels (or $CKPTD_KERNEL_CACHE), keyed by the source, the flags and the
CPU, so a changed file or another machine builds afresh; concurrent builds race
harmlessly (each renames a complete file into place). `build` raises OSError or
subprocess.SubprocessError where no compiler works; `Library` builds on first use and
answers None there instead (with one warning), so its caller falls back to torch.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("ckptd.kernels")


def _cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))


def build(src: Path, flags: list[str], prefix: str) -> ctypes.CDLL:
    """The library compiled from `src` with `flags`, loaded (built first if needed)."""
    cc = os.environ.get("CC", "cc")
    code = src.read_bytes()
    key = hashlib.blake2b(code + " ".join([cc, *flags]).encode() + _cpu_id().encode(),
                          digest_size=12).hexdigest()
    root = Path(os.environ.get("CKPTD_KERNEL_CACHE",
                               Path.home() / ".cache" / "ckptd" / "kernels"))
    lib = root / f"{prefix}-{key}.so"
    if not lib.exists():
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=root)
        os.close(fd)
        try:
            subprocess.run([cc, *flags, str(src), "-o", tmp, "-lm"], check=True,
                           capture_output=True, timeout=120)
            os.replace(tmp, lib)        # atomic: a concurrent build loses nothing
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return ctypes.CDLL(str(lib))


class Library:
    """One C kernel file's library, built and bound (`bind` sets its functions'
    argtypes) on the first `load()`. None where $`switch` is "0" or nothing compiles;
    `fallback` says in the warning what serves instead."""

    def __init__(self, src: Path, flags: list[str], prefix: str, switch: str,
                 bind: Callable[[ctypes.CDLL], None], fallback: str) -> None:
        self.src, self.flags, self.prefix, self.switch = src, flags, prefix, switch
        self.bind, self.fallback = bind, fallback
        self.lib: ctypes.CDLL | None = None
        self.tried = False
        self._lock = threading.Lock()

    def load(self) -> ctypes.CDLL | None:
        if self.tried:          # every kernel call asks: no lock once the answer is known
            return self.lib
        with self._lock:
            if not self.tried:
                if os.environ.get(self.switch, "1") != "0":
                    try:
                        lib = build(self.src, self.flags, self.prefix)
                        self.bind(lib)
                        self.lib = lib
                    except (OSError, subprocess.SubprocessError) as e:
                        err = getattr(e, "stderr", b"") or b""
                        tail = (": " + err.decode(errors="replace")[-300:]) if err else ""
                        log.warning("cannot build %s (%s%s); %s", self.src, e, tail,
                                    self.fallback)
                self.tried = True     # after lib: a thread that sees it sees the answer
            return self.lib

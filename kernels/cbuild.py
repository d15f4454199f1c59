"""Building a C kernel file (kernels/*/cpu.c) once per machine, for ctypes.

The library is built with the system C compiler (`cc`, override with $CC) into
~/.cache/ckptd/kernels (or $CKPTD_KERNEL_CACHE), keyed by the source, the flags and the
CPU, so a changed file or another machine builds afresh; concurrent builds race
harmlessly (each renames a complete file into place). Raises OSError or
subprocess.SubprocessError where no compiler works: the caller falls back to torch.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path


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

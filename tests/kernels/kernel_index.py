"""Every Triton kernel of kernels/, by the name the compile gate and the launch records use
(its module's last part, a dot, its name)."""

from __future__ import annotations

import importlib
import pkgutil

from ckptd import kernels


def all_kernels() -> set[str]:
    """module.name of every Triton kernel (a jitted function named *_kernel) of kernels/,
    but the optional external ones (kernels/external: fla, flash-attn) and the selective
    scans (kernels/mamba1, mamba2: the gate's models have none; test_mamba_compile.py
    compiles them for the same targets)."""
    found = set()
    for info in pkgutil.walk_packages(kernels.__path__, "ckptd.kernels."):
        if any(part in info.name for part in (".external", ".mamba1", ".mamba2")):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.endswith("_kernel") and hasattr(obj, "fn") and \
                    getattr(obj.fn, "__module__", None) == info.name:
                found.add(f"{info.name.rsplit('.', 1)[-1]}.{name}")
    return found

"""Optional kernels of other projects (`pip install ckptd[gpu]`): fla's chunked gated
delta rule (fla.py) and flash-attn's varlen attention (flash.py), behind ckptd's
signatures; kernels/dispatch.py picks them for prefill steps on CUDA."""

from __future__ import annotations

import importlib
import logging

log = logging.getLogger(__name__)
MODULES = {"fla": "fla.ops.gated_delta_rule", "flash": "flash_attn"}
_IMPORTS: dict[str, bool] = {}


def imports(name: str) -> bool:
    """Whether the external kernel `name` imports here, tried once: a package that is
    installed but does not import (built for another Triton or CUDA) leaves ckptd's own
    kernels in place, with one warning, instead of failing every prefill."""
    ok = _IMPORTS.get(name)
    if ok is None:
        try:
            importlib.import_module(MODULES[name])
            ok = True
        except Exception as e:          # any failure of a third party's import
            log.warning("kernels: %s is installed but does not import (%s: %s); ckptd's "
                        "own kernels run instead", name, type(e).__name__, e)
            ok = False
        _IMPORTS[name] = ok
    return ok

"""Kept tensors for the quant kernel tests: every format, quantized by the gguf package
where it can (Q4_0, Q4_1, Q8_0), else random block bytes with small finite fp16 scales
(every bit pattern of the quants, scale and min fields is a valid K-quant block)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ckptd.kernels.quant.formats import FORMATS, QuantTensor

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "quant" / "tiny-hybrid-mix.gguf"
BLOCK_FORMATS = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
ALL_FORMATS = (*BLOCK_FORMATS, "F16", "BF16")


def kept(fmt: str, rows: int, cols: int, lead: tuple[int, ...] = (), seed: int = 0
         ) -> QuantTensor:
    import gguf

    rng = np.random.default_rng(seed)
    n = int(np.prod(lead, dtype=np.int64)) * rows
    if fmt in ("Q4_0", "Q4_1", "Q8_0"):
        w = rng.standard_normal((n, cols)).astype(np.float32)
        b = gguf.quants.quantize(w, gguf.GGMLQuantizationType[fmt])
    elif fmt in ("F16", "BF16"):
        dt = torch.float16 if fmt == "F16" else torch.bfloat16
        b = torch.from_numpy(rng.standard_normal((n, cols)).astype(np.float32)).to(dt)
        b = b.view(torch.uint8).numpy()
    else:
        _, bs, ts = FORMATS[fmt]
        b = rng.integers(0, 256, (n, cols // bs, ts), dtype=np.uint8)
        scale = (rng.random((n, cols // bs, 1)) * 0.02).astype(np.float16).view(np.uint8)
        if fmt == "Q6_K":
            b[..., 208:210] = scale
        else:
            b[..., 0:2] = scale
            b[..., 2:4] = scale
    data = torch.from_numpy(np.ascontiguousarray(b).reshape(*lead, rows, -1))
    return QuantTensor(data, fmt, (*lead, rows, cols))

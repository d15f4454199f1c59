"""Test pictures: seeded random pixels, as Pillow images or encoded bytes."""

from __future__ import annotations

import base64
import io

import numpy as np


def picture(width: int, height: int, seed: int = 0, mode: str = "RGB"):
    """A Pillow image of seeded random pixels (RGBA: random alpha too)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    channels = 4 if mode == "RGBA" else 3
    img = Image.fromarray(rng.integers(0, 256, (height, width, channels), dtype=np.uint8),
                          "RGBA" if channels == 4 else "RGB")
    return img if mode in ("RGB", "RGBA") else img.convert(mode)


def encoded(width: int, height: int, seed: int = 0, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    picture(width, height, seed).save(buf, format=fmt)
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"

"""An image as the model's processor makes it (transformers' Qwen2VLImageProcessorPil,
which Qwen3.5's Qwen3VLProcessor uses): decoded with Pillow, transparency composited on
white, RGB, resized with bicubic resampling so that both sides are multiples of
patch_size * merge_size and the pixel count lies in [min_pixels, max_pixels] (aspect
ratio kept as closely as that allows), scaled to [0, 1], normalised by mean and std,
and cut into patches [n, C * T * P * P] (the one frame repeated T times), ordered merge
block by merge block.

An image is named by its digest: blake2b over the decoded pixels, their size and the
patch grid, so the same picture sent as a data URL or as a file gives one digest, and
two pictures of one size two.
"""

from __future__ import annotations

import hashlib
import io
import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ckptd.model.vision.config import Processing

MAX_ASPECT = 200         # the processor's limit on the longer side over the shorter


class ImageError(ValueError):
    """An image that can't be used: not decodable, or outside the bounds."""


@dataclass(frozen=True)
class Limits:
    """Bounds on an input image before it is resized (flags)."""
    max_bytes: int = 20 * 1024 * 1024
    max_side: int = 8192
    max_pixels: int = 8192 * 8192


@dataclass(frozen=True)
class Prepared:
    """A decoded image, resized for the model: what its placeholder tokens stand for."""
    rgb: np.ndarray           # uint8 [H, W, 3], H and W multiples of the resize factor
    grid: tuple[int, int, int]   # (t, h, w) in patches
    digest: bytes             # 32 bytes: pixels as decoded, their size, the grid
    size: tuple[int, int]     # (width, height) as sent

    def tokens(self, merge: int) -> int:
        t, h, w = self.grid
        return t * h * w // (merge * merge)


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
    """(height, width): multiples of factor, pixel count within bounds, aspect ratio
    kept as closely as possible (transformers' smart_resize, the same arithmetic)."""
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ImageError(f"the image's aspect ratio exceeds {MAX_ASPECT}:1")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def decode(data: bytes, limits: Limits = Limits()):
    """A Pillow RGB image from encoded bytes (PNG, JPEG, WebP, GIF's first frame, ...);
    ImageError saying why not."""
    if not data:
        raise ImageError("the image is empty")
    if len(data) > limits.max_bytes:
        raise ImageError(f"the image is {len(data)} bytes, more than the limit of "
                         f"{limits.max_bytes} (--image-max-bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            w, h = img.size
            _check_size(w, h, limits)
            img.load()
    except ImageError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError,
            Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
        raise ImageError(f"cannot decode the image: {e}") from None
    return to_rgb(img)


def _check_size(w: int, h: int, limits: Limits) -> None:
    if w <= 0 or h <= 0:
        raise ImageError("the image has no pixels")
    if max(w, h) > limits.max_side:
        raise ImageError(f"the image is {w}x{h}, a side longer than {limits.max_side} "
                         "(--image-max-side)")
    if w * h > limits.max_pixels:
        raise ImageError(f"the image is {w}x{h} = {w * h} pixels, more than "
                         f"{limits.max_pixels} (--image-max-pixels)")


def to_rgb(img):
    """RGB, transparency composited on white (as the processor's convert_to_rgb)."""
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def prepare(img, proc: Processing, limits: Limits = Limits()) -> Prepared:
    """A decoded Pillow image resized for the model, with its digest."""
    w, h = img.size
    _check_size(w, h, limits)
    rgb = np.asarray(to_rgb(img), dtype=np.uint8)
    th, tw = smart_resize(h, w, proc.factor, proc.min_pixels, proc.max_pixels)
    resized = rgb if (th, tw) == (h, w) else np.asarray(
        Image.fromarray(rgb).resize((tw, th), resample=Image.Resampling.BICUBIC))
    grid = (1, th // proc.patch_size, tw // proc.patch_size)
    d = hashlib.blake2b(digest_size=32)
    d.update(np.array([w, h, *grid], dtype="<u4").tobytes())
    d.update(np.ascontiguousarray(rgb).tobytes())
    return Prepared(np.ascontiguousarray(resized), grid, d.digest(), (w, h))


def patches(image: Prepared, proc: Processing) -> torch.Tensor:
    """float32 [t*h*w, 3 * T * P * P]: the processor's pixel_values of one image."""
    x = torch.from_numpy(image.rgb.copy()).permute(2, 0, 1).float() / 255.0
    mean = torch.tensor(proc.mean, dtype=torch.float32).view(3, 1, 1)
    std = torch.tensor(proc.std, dtype=torch.float32).view(3, 1, 1)
    x = (x - mean) / std
    _, gh, gw = image.grid
    P, m, T = proc.patch_size, proc.merge_size, proc.temporal_patch_size
    x = x.reshape(3, gh // m, m, P, gw // m, m, P).permute(1, 4, 2, 5, 0, 3, 6)
    # (blocks down, blocks across, m, m, C, P, P): a frame repeated T times
    x = x.unsqueeze(5).expand(*x.shape[:5], T, P, P)
    return x.reshape(gh * gw, 3 * T * P * P).contiguous()

"""Where an image sits in a sequence, and the M-RoPE positions of every token.

Qwen3.5 rotates each query and key by three positions (temporal, height, width), one
per section of its rotary frequencies. A text token has all three equal. An image's
placeholder tokens (one per merged patch block, h' x w' of them row by row) all share
the temporal position s, where s is the position the image starts at, and take s + row
and s + column as height and width. The text after the image continues from the
image's largest position + 1: s + max(h', w'). So positions run behind token indices
after an image: a text token at index i has position i + shift(i), shift(i) summing
max(h', w') - h' * w' over the images before it (transformers: get_rope_index).

The KV of a token lives at its index (pages, context lengths); only the rotary angle
uses the position. A recurrent layer counts tokens, not positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ckptd.model.vision.image import Prepared


@dataclass(frozen=True)
class ImageSpan:
    """One image's placeholder tokens in a sequence: tokens [start, start + length)."""
    start: int
    grid: tuple[int, int, int]   # (t, h, w) in patches, before the merge
    merge: int
    digest: bytes                # names the image and the encoder that sees it (keys)
    image: Prepared | None = None   # the pixels, to encode (None: never encoded here)

    @property
    def rows(self) -> int:
        return self.grid[1] // self.merge

    @property
    def cols(self) -> int:
        return self.grid[2] // self.merge

    @property
    def length(self) -> int:
        return self.grid[0] * self.rows * self.cols

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def advance(self) -> int:
        """Positions the image takes: the text after it starts this far past its start."""
        return max(self.rows, self.cols)

    def moved(self, start: int) -> ImageSpan:
        return ImageSpan(start, self.grid, self.merge, self.digest, self.image)


def shift_at(images: Sequence[ImageSpan], index: int) -> int:
    """position - index for a text token at `index` (images before it end at or
    before it)."""
    return sum(im.advance - im.length for im in images if im.end <= index)


def next_position(images: Sequence[ImageSpan], index: int) -> int:
    """The position the token at `index` gets when it is text: after a prefix of
    `index` tokens, the position to continue from."""
    return index + shift_at(images, index)


def inside(images: Sequence[ImageSpan], index: int) -> ImageSpan | None:
    """The image that `index` falls strictly inside (a cut there would split it)."""
    return next((im for im in images if im.start < index < im.end), None)


def check_spans(images: Sequence[ImageSpan], n_tokens: int, image_token: int,
                tokens: Sequence[int]) -> None:
    """ValueError unless the spans are in order, apart, within the tokens, and cover
    exactly the image placeholder tokens."""
    at = 0
    for im in images:
        if im.start < at or im.end > n_tokens or im.length <= 0:
            raise ValueError(f"image placeholders at {im.start}..{im.end} overlap or run "
                             f"past the {n_tokens} tokens")
        if any(t != image_token for t in tokens[im.start:im.end]):
            raise ValueError(f"tokens {im.start}..{im.end} are not all image placeholders")
        at = im.end
    covered = sum(im.length for im in images)
    if sum(1 for t in tokens if t == image_token) != covered:
        raise ValueError("the prompt has image placeholder tokens without an image")


def chunk_positions(images: Sequence[ImageSpan], start: int, end: int
                    ) -> tuple[int, torch.Tensor | None]:
    """Positions of tokens [start, end): (shift, None) when they are all text after the
    same images (position = index + shift), else (0, int64 [3, end - start])."""
    hit = [im for im in images if im.start < end and im.end > start]
    if not hit:
        return shift_at(images, start), None
    pos = torch.empty(3, end - start, dtype=torch.int64)
    at = start
    for im in hit + [None]:
        stop = end if im is None else max(im.start, start)
        if stop > at:         # text before this image
            pos[:, at - start:stop - start] = torch.arange(at, stop) + shift_at(images, at)
        if im is None:
            break
        s = next_position(images, im.start)
        k = torch.arange(max(im.start, start), min(im.end, end)) - im.start
        area = im.rows * im.cols
        pos[0, k + im.start - start] = s + k // area     # frames of an image: t grows
        pos[1, k + im.start - start] = s + (k % area) // im.cols
        pos[2, k + im.start - start] = s + k % im.cols
        at = min(im.end, end)
    return 0, pos

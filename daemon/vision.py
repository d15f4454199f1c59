"""The daemon's image input: which vision tower it loads, with which resize bounds, and
how a request's images become placeholder tokens.

An HF folder with `model.visual.*` weights brings its tower; a GGUF model takes one
with `--mmproj FILE` (llama.cpp's mmproj GGUF), as llama-server does; `--no-mmproj`
serves the text model alone. `--image-min-tokens` / `--image-max-tokens` set the
model's resize bounds in placeholder tokens (llama-server's flags).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from ckptd.daemon.config import ServeConfig
from ckptd.model.vision.embedder import ImageEmbedder
from ckptd.model.vision.image import Limits
from ckptd.model.vision.load import load_mmproj, load_vision_hf

log = logging.getLogger("ckptd")


def load_embedder(cfg: ServeConfig, path: Path, model, tokenizer, where
                  ) -> ImageEmbedder | None:
    """The model's vision tower with its output cache, or None (text only). ValueError
    when the tower does not fit the model."""
    if cfg.no_mmproj:
        return None
    if cfg.mmproj is not None:
        encoder = load_mmproj(cfg.mmproj, tokenizer, where.dtype, where.device)
    elif path.is_dir():
        encoder = load_vision_hf(path, where.dtype, where.device)
    else:
        return None
    if encoder is None:
        return None
    vc = encoder.config
    if vc.out_hidden_size != model.config.hidden_size:
        raise ValueError(f"the vision tower's output ({vc.out_hidden_size}) is not the "
                         f"model's hidden size ({model.config.hidden_size})")
    if not 0 <= vc.image_token_id < model.config.vocab_size:
        raise ValueError(f"the image placeholder token {vc.image_token_id} is outside the "
                         "model's vocabulary")
    per_token = vc.processing.factor ** 2
    bounds = {}
    if cfg.image_min_tokens is not None:
        bounds["min_pixels"] = cfg.image_min_tokens * per_token
    if cfg.image_max_tokens is not None:
        bounds["max_pixels"] = cfg.image_max_tokens * per_token
    if bounds:
        proc = replace(vc.processing, **bounds)
        if proc.min_pixels > proc.max_pixels:
            raise ValueError("--image-min-tokens exceeds the most tokens an image may take")
        encoder.config = replace(vc, processing=proc)
    embedder = ImageEmbedder(encoder, model.dtype)
    log.info("vision: %s, %d blocks, images of %d to %d tokens",
             Path(cfg.mmproj).name if cfg.mmproj else "model.visual.*", vc.depth,
             max_image_tokens(embedder, low=True), max_image_tokens(embedder))
    return embedder


def max_image_tokens(embedder: ImageEmbedder, low: bool = False) -> int:
    """The most (low: fewest) placeholder tokens one image is resized to."""
    proc = embedder.config.processing
    return (proc.min_pixels if low else proc.max_pixels) // proc.factor ** 2


def limits(cfg: ServeConfig) -> Limits:
    return Limits(cfg.image_max_bytes, cfg.image_max_side, cfg.image_max_pixels)

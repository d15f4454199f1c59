"""The vision encoder's output per image, computed once: an LRU in memory keyed by the
image's digest (the same one its cache keys carry), within a byte budget. A prompt
whose image tokens are all restored from the cache never asks for them; a second
prompt with the same image, whatever text comes before it, reads them from here.

Used on the engine's thread only (the runner asks for a step's images), so it holds
no lock; the counters are plain ints read by metrics.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict

import torch

from ckptd.model.vision.encoder import VisionModel
from ckptd.model.vision.image import Prepared, patches
from ckptd.model.vision.positions import ImageSpan


class ImageEmbedder:
    def __init__(self, encoder: VisionModel, dtype: torch.dtype | None = None,
                 max_bytes: int = 512 << 20) -> None:
        """dtype: of the embeddings handed out (the text model's); max_bytes: what the
        LRU keeps."""
        self.encoder = encoder
        self.config = encoder.config
        self.fingerprint: str = getattr(encoder, "fingerprint", "")
        self.dtype = dtype or encoder.dtype
        self.max_bytes = max_bytes
        self.lru: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0
        self.encode_seconds = 0.0
        self.images_encoded = 0

    def span(self, image: Prepared, start: int) -> ImageSpan:
        """The placeholder tokens of `image` from token `start`, named by its digest
        under this encoder's fingerprint."""
        digest = hashlib.blake2b(self.fingerprint.encode() + b"\0" + image.digest,
                                 digest_size=32).digest()
        return ImageSpan(start, image.grid, self.config.spatial_merge_size, digest, image)

    def tokens(self, image: Prepared) -> int:
        return image.tokens(self.config.spatial_merge_size)

    def embeds(self, spans: list[ImageSpan]) -> list[torch.Tensor]:
        """Each span's embeddings [length, out_hidden], the ones not held encoded together
        in one call of the encoder."""
        missing: dict[bytes, ImageSpan] = {}
        for s in spans:
            if s.digest in self.lru:
                self.lru.move_to_end(s.digest)
            elif s.digest not in missing:
                if s.image is None:
                    raise ValueError("an image's pixels are needed to encode it")
                missing[s.digest] = s
        self.hits += len(spans) - len(missing)
        if missing:
            self._encode(list(missing.values()))
        return [self.lru[s.digest] for s in spans]

    def _encode(self, spans: list[ImageSpan]) -> None:
        t0 = time.perf_counter()
        proc = self.config.processing
        x = torch.cat([patches(s.image, proc) for s in spans])
        out = self.encoder(x, [s.grid for s in spans]).to(self.dtype)
        self.encode_seconds += time.perf_counter() - t0
        self.misses += len(spans)
        self.images_encoded += len(spans)
        for s, emb in zip(spans, out.split([s.length for s in spans])):
            self.lru[s.digest] = emb
            self.bytes += emb.numel() * emb.element_size()
        # keep at least this call's images, whatever the budget
        while self.bytes > self.max_bytes and len(self.lru) > len(spans):
            _, old = self.lru.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()

    def clear(self) -> None:
        self.lru.clear()
        self.bytes = 0

    def release(self) -> None:
        """Let go of the encoder and what it computed (the daemon sleeps)."""
        self.encoder = None
        self.clear()

    def reload(self, encoder: VisionModel) -> None:
        self.encoder = encoder

"""Model identity for cache keys: two models never share cache entries."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from ckptd.model.config import ModelConfig

_EDGE = 1 << 20  # bytes hashed at each end of a weight file


def model_fingerprint(cfg: ModelConfig, weight_files: list[Path], dtype: torch.dtype,
                      weights: str = "expand") -> str:
    """Hex blake2b-128 over the config, the compute dtype, the weights' format in memory
    (`keep`: as the GGUF stores them; `expand`, hashed as nothing, so caches made before
    the option existed stay valid), and each weight file's size plus its first and
    last MiB.

    Hashing whole files would cost minutes on a 16 GB checkpoint at every start; the
    size and both ends (headers, tensor index, first and last tensors) change with any
    re-export, re-quantization or fine-tune we know of.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(cfg.raw, sort_keys=True, default=str).encode())
    h.update(str(dtype).encode())
    if weights != "expand":
        h.update(f"weights={weights}".encode())
    hash_files(h, weight_files)
    return h.hexdigest()


def folded(fingerprint: str, setting: str) -> str:
    """A model's fingerprint with a serving setting that changes its KV or logits folded
    in ("kv=torch.float16", "gemv=q8"): caches made under another never mix."""
    return hashlib.blake2b(f"{fingerprint} {setting}".encode(), digest_size=16).hexdigest()


def kv_fingerprint(fingerprint: str, kv_dtype: torch.dtype) -> str:
    """A model's fingerprint once its KV is kept in kv_dtype, not its compute dtype."""
    return folded(fingerprint, f"kv={kv_dtype}")


def hash_files(h, files: list[Path]) -> None:
    """Feed each file's name, size and first and last MiB to the hash `h`."""
    for f in sorted(files):
        size = f.stat().st_size
        h.update(f.name.encode() + size.to_bytes(8, "little"))
        with open(f, "rb") as fh:
            h.update(fh.read(_EDGE))
            if size > _EDGE:
                fh.seek(max(_EDGE, size - _EDGE))
                h.update(fh.read(_EDGE))

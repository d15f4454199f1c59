"""A snapshot: the state at one exact position that its blocks do not hold.

For a state at P = dB + r (d full blocks, r < B tokens after them): the recurrent
layers' state at P, the KV of the r tokens in the partial page, and, when P ends
a prompt, the logits of its last position (so an exact repeat computes nothing).
It travels between the cache manager and the store as this dataclass; the store
keeps it as named tensors (cache/codec.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ckptd.model.spec import StateSpec


@dataclass
class Snapshot:
    conv: torch.Tensor | None = None     # [n_rec, conv_dim, K-1]
    ssm: torch.Tensor | None = None      # [n_rec, v_heads, k_head_dim, v_head_dim] float32
    kv: torch.Tensor | None = None       # [n_attn, 2, r, kv_heads, head_dim], r = P mod B
    logits: torch.Tensor | None = None   # [vocab] float32, at the end of a prompt

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors it holds, by name."""
        return {f.name: t for f in fields(self) if (t := getattr(self, f.name)) is not None}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> Snapshot:
        names = {f.name for f in fields(cls)}
        extra = set(tensors) - names
        if extra:
            raise ValueError(f"a snapshot holds {sorted(names)}, got {sorted(tensors)}")
        return cls(**tensors)

    def __bool__(self) -> bool:
        return bool(self.tensors())


def check_tensors(spec: StateSpec, P: int, tensors: dict[str, torch.Tensor]) -> None:
    """ValueError unless tensors are exactly what a snapshot at P holds under spec: the
    recurrent state where the model has recurrent layers, the partial page's KV where
    P is inside a page, and maybe the last logits."""
    want = {}
    if spec.recurrent is not None:
        want["conv"] = (spec.conv_shape(), spec.recurrent.conv_dtype)
        want["ssm"] = (spec.ssm_shape(), spec.recurrent.ssm_dtype)
    if spec.attention is not None and P % spec.block_size:
        want["kv"] = (spec.kv_shape(P % spec.block_size), spec.attention.dtype)
    if P == 0:
        raise ValueError("a snapshot covers at least one token")
    extra = set(tensors) - set(want) - {"logits"}
    if extra or not set(want) <= set(tensors) or not tensors:
        raise ValueError(f"a snapshot at {P} holds {sorted(want)} (+ optional logits), "
                         f"got {sorted(tensors)}")
    for name, (shape, dtype) in want.items():
        t = tensors[name]
        if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
            raise ValueError(f"snapshot {name!r} must be {list(shape)} {dtype}, "
                             f"got {list(t.shape)} {t.dtype}")

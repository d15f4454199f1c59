"""A snapshot: the state at one exact position that its blocks do not hold.

For a state at P = dB + r (d full blocks, r < B tokens after them): the recurrent
layers' state at P, the KV of the r tokens in the partial page, and, when P ends
a prompt, the logits of its last position (so an exact repeat computes nothing).
It travels between the cache manager and the store as this dataclass; the store
keeps it as named tensors (cache/codec.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


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

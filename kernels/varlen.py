"""The packed sequences of one model step, as every varlen kernel takes them.

A step runs n sequences' chunks packed into one flat token dimension N; sequence i
is tokens cu[i]:cu[i+1], starts after ctx_lens[i] tokens of state, and keeps its
recurrent state in pool cell state_indices[i]. A `Varlen` carries this twice: host
ints, which decide launch shapes (grids, loop bounds) without reading the device,
and device tensors, which the kernels read. The runner builds it once per step with
one host-to-device copy (model/runner.py), so no layer syncs with the host.

Kernels also take a plain `cu_seqlens` (a list or a tensor), as their tests do:
`host_cu` / `device_cu` turn either into what they need.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CHUNK = 64        # the gated delta rule's chunk length, whose chunk bounds are prebuilt


@dataclass(frozen=True)
class Varlen:
    cu: tuple[int, ...]            # host [n + 1]
    ctx: tuple[int, ...]           # host [n]: tokens each sequence holds before the step
    tables: tuple                  # host int32 [pages] page table of each sequence
    cu_seqlens: torch.Tensor       # int32 [n + 1] on the device
    ctx_lens: torch.Tensor         # int32 [n]
    state_indices: torch.Tensor    # int64 [n]: recurrent state cells
    page_tables: torch.Tensor      # int32 [n, max_pages], zero-padded
    chunk_bos: torch.Tensor        # int32 [chunks]: first token of each CHUNK-long chunk
    chunk_eos: torch.Tensor        # int32 [chunks]: one past its last

    @property
    def n(self) -> int:
        return len(self.cu) - 1

    @property
    def max_q_len(self) -> int:
        return max((b - a for a, b in zip(self.cu, self.cu[1:])), default=0)

    @property
    def decode_only(self) -> bool:
        return self.max_q_len == 1 and self.cu[-1] == self.n


def chunk_bounds(cu, chunk_size: int = CHUNK) -> tuple[list[int], list[int]]:
    """(first token, one past the last) of every chunk_size-long chunk of every sequence."""
    bos = [s for a, b in zip(cu, cu[1:]) for s in range(a, b, chunk_size)]
    eos = [min(s + chunk_size, b) for a, b in zip(cu, cu[1:]) for s in range(a, b, chunk_size)]
    return bos, eos


def check_cu(cu_seqlens, n_tokens: int, state_indices) -> list[int]:
    """cu_seqlens as host ints, rising from 0 to n_tokens, with one state index per
    sequence; ValueError otherwise."""
    cu = host_cu(cu_seqlens)
    if not cu or cu[0] != 0 or cu[-1] != n_tokens or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must rise from 0 to {n_tokens}, got {cu}")
    if len(state_indices) != len(cu) - 1:
        raise ValueError(f"need one state index per sequence: {len(cu) - 1}, "
                         f"got {len(state_indices)}")
    return cu


def one_token_each(cu: list[int]) -> bool:
    """Several sequences of one token each: a batched decode."""
    return len(cu) > 2 and cu == list(range(len(cu)))


def host_cu(cu_seqlens) -> list[int]:
    """cu_seqlens as host ints (from a Varlen without touching the device)."""
    if isinstance(cu_seqlens, Varlen):
        return list(cu_seqlens.cu)
    if torch.is_tensor(cu_seqlens):
        return [int(c) for c in cu_seqlens.tolist()]
    return [int(c) for c in cu_seqlens]


def device_cu(cu_seqlens, device: torch.device) -> torch.Tensor:
    """cu_seqlens as an int32 tensor on the device (a Varlen's own: no copy)."""
    if isinstance(cu_seqlens, Varlen):
        return cu_seqlens.cu_seqlens
    return torch.as_tensor(host_cu(cu_seqlens) if not torch.is_tensor(cu_seqlens) else
                           cu_seqlens, device=device).to(torch.int32)

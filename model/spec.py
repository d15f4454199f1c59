"""The contract between model/ and cache/: the state's layout (StateSpec), what the
runner offers the cache to read and write it (StateIO), the error a full state pool
raises (OutOfCells), and a step's logits with the rows each sequence owns (StepLogits).

A sequence state at position P is: the K/V of every attention layer for tokens
[0, P), plus every recurrent layer's conv state and recurrent (delta-rule or
selective state space) state at P.

Layouts (fixed here, used by the runner, the kernels and the cache tiers):

    KV page        [n_attn, 2, block_size, kv_heads, head_dim]   kv_dtype
                   (one page = block_size tokens of every attention layer, K then V)
    device KV pool [num_pages, n_attn, 2, block_size, kv_heads, head_dim]
    conv state     [n_rec, conv_dim, conv_kernel - 1]             conv_dtype
                   (the last conv_kernel-1 inputs of the causal conv, oldest first)
    ssm state      [n_rec, v_heads, k_head_dim, v_head_dim]       float32
                   (Gated DeltaNet; a selective state space layer declares its state
                   [heads, head_dim, state_size] in those three: RecurrentSpec.ssm)

Attention layers are numbered 0..n_attn-1 and recurrent layers 0..n_rec-1 in
the order they appear in the model.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ckptd.model.sequence import Sequence


@dataclass(frozen=True)
class AttentionSpec:
    n_layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    # each attention layer's sliding window (0: it sees every key), () when none has
    # one. A page still holds every layer's KV in the store's and the host's copies; on
    # the device the window layers' KV lives apart and only while a live sequence's
    # window reaches it (model/window_pages.py)
    windows: tuple[int, ...] = ()

    @property
    def window_layers(self) -> list[int]:
        return [i for i, w in enumerate(self.windows) if w]

    @property
    def max_window(self) -> int:
        """The widest window of the window layers (0: no layer has one)."""
        return max(self.windows, default=0)


@dataclass(frozen=True)
class RecurrentSpec:
    n_layers: int
    conv_dim: int
    conv_kernel: int
    v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_dtype: torch.dtype
    ssm_dtype: torch.dtype = torch.float32

    @classmethod
    def ssm(cls, n_layers: int, conv_dim: int, conv_kernel: int, heads: int, head_dim: int,
            state_size: int, conv_dtype: torch.dtype) -> RecurrentSpec:
        """Selective state space layers (Mamba2: [heads, head_dim, state_size]; Mamba:
        [1, d_inner, state_size]): the same two tensors per layer as Gated DeltaNet's,
        so the cache stores, thins and restores them alike."""
        return cls(n_layers, conv_dim, conv_kernel, heads, head_dim, state_size, conv_dtype)


@dataclass(frozen=True)
class StateSpec:
    block_size: int
    attention: AttentionSpec | None
    recurrent: RecurrentSpec | None

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.attention is None and self.recurrent is None:
            raise ValueError("a model has attention layers, recurrent layers, or both")

    @property
    def is_hybrid(self) -> bool:
        """True when some layer's state can't be cut: restores need snapshots."""
        return self.recurrent is not None and self.recurrent.n_layers > 0

    @property
    def kv_dtype(self) -> torch.dtype:
        """The dtype of a page's KV; a model without attention has pages of no bytes
        (kept for the prefix chain of its blocks), float32 by convention."""
        return torch.float32 if self.attention is None else self.attention.dtype

    def kv_shape(self, n_tokens: int | None = None) -> tuple[int, ...]:
        """Shape of n_tokens (default: one page) of KV for all attention layers."""
        a = self.attention
        if a is None:
            return (0,)
        n = self.block_size if n_tokens is None else n_tokens
        return (a.n_layers, 2, n, a.kv_heads, a.head_dim)

    def conv_shape(self) -> tuple[int, ...]:
        r = self.recurrent
        return () if r is None else (r.n_layers, r.conv_dim, r.conv_kernel - 1)

    def ssm_shape(self) -> tuple[int, ...]:
        r = self.recurrent
        return () if r is None else (r.n_layers, r.v_heads, r.k_head_dim, r.v_head_dim)

    def page_bytes(self) -> int:
        if self.attention is None:
            return 0
        return _numel(self.kv_shape()) * _itemsize(self.attention.dtype)

    def window_page_bytes(self) -> int:
        """The window layers' part of a page (0 without window layers)."""
        a = self.attention
        if a is None or not a.windows:
            return 0
        return self.page_bytes() // a.n_layers * len(a.window_layers)

    def kv_bytes_per_token(self) -> int:
        return self.page_bytes() // self.block_size

    def snapshot_bytes(self, partial_tokens: int = 0) -> int:
        """Bytes of one recurrent snapshot plus `partial_tokens` of unpaged KV."""
        n = 0
        if self.recurrent is not None:
            n += _numel(self.conv_shape()) * _itemsize(self.recurrent.conv_dtype)
            n += _numel(self.ssm_shape()) * _itemsize(self.recurrent.ssm_dtype)
        if self.attention is not None and partial_tokens:
            n += _numel(self.kv_shape(partial_tokens)) * _itemsize(self.attention.dtype)
        return n

    def describe(self) -> dict:
        """A JSON-able description, part of the model fingerprint."""
        def one(x):
            if x is None:
                return None
            # the windows change where the device keeps KV, not what is stored
            return {k: str(v) if isinstance(v, torch.dtype) else v for k, v in vars(x).items()
                    if k != "windows"}
        return {"block_size": self.block_size, "attention": one(self.attention),
                "recurrent": one(self.recurrent)}


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class StepLogits:
    """A step's logits and whose rows they are, worked out once, where the rows are
    chosen: rows [n, vocab] float32 (on the CPU, or where the model ran for backend
    sampling), and for each sequence of the step the slice of its rows: its last
    token's, or every token it computed where the step was asked for them (row i then
    predicts the token after its i-th). Empty (false) when no model call was made."""
    rows: torch.Tensor | None = None
    spans: dict[int, slice] = field(default_factory=dict)     # sequence id -> its rows

    def __bool__(self) -> bool:
        return bool(self.spans)

    def of(self, seq: Sequence) -> torch.Tensor:
        """seq's rows [k, vocab]."""
        return self.rows[self.spans[seq.id]]

    def last(self, seq: Sequence) -> torch.Tensor:
        """The logits [vocab] after seq's last computed token."""
        return self.rows[self.spans[seq.id].stop - 1]



class OutOfCells(RuntimeError):
    """No free recurrent state cell: the request waits, it never crashes anything."""


class StateIO(Protocol):
    """What the cache asks of the runner (model/runner.py), which owns the state tensors:
    a sequence's cell, copy-on-write of a page, and host copies in and out of pages,
    partial pages and recurrent cells, for restores and checkpoints; a window model's
    rooms for its window layers' KV on the device (model/window_pages.py)."""

    vocab_size: int

    def attach(self, seq: Sequence) -> None: ...
    def detach(self, seq: Sequence) -> None: ...
    def live_cells(self) -> set[int]: ...
    def copy_page(self, src: int, dst: int) -> None: ...
    def page_views(self, pages: list[int]) -> list[torch.Tensor] | None: ...
    def page_addresses(self, pages: list[int]) -> list[int] | None: ...
    def page_run(self, first: int, n: int) -> torch.Tensor | None: ...
    def read_pages(self, pages: list[int]) -> torch.Tensor: ...
    def load_pages(self, pages: list[int], kv: torch.Tensor) -> None: ...
    def read_partial(self, page: int, n: int) -> torch.Tensor: ...
    def load_partial(self, page: int, kv: torch.Tensor) -> None: ...
    def keep_window(self, pages: list[int]) -> bool: ...
    def drop_window(self, pages: list[int]) -> None: ...
    def has_window(self, pages: list[int]) -> list[bool]: ...
    def read_recurrent(self, cell: int) -> tuple[torch.Tensor, torch.Tensor]: ...
    def load_recurrent(self, cell: int, conv: torch.Tensor, ssm: torch.Tensor) -> None: ...
    def deferred_reads(self) -> AbstractContextManager: ...
    def wait_reads(self) -> None: ...

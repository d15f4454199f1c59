"""Device-resident sequence state: the KV page pool and recurrent state cells.

Layouts are the ones model/spec.py fixes. This module owns the tensors and the
cell bookkeeping (one cell per live sequence, never shared); which pages a
sequence holds, and the refcounts of shared ones, are the cache's device tier
(cache/device.py).
"""

from __future__ import annotations

import threading

import torch

from ckptd.kernels.paged_attention import layout
from ckptd.model.spec import OutOfCells, StateSpec


class DeviceState:
    """kv   [num_pages, n_attn, 2, block_size, kv_heads, head_dim] (on the CPU a view of
         head-major memory: kernels/paged_attention/layout.py)
    conv [num_cells, n_rec, conv_dim, conv_kernel - 1]
    ssm  [num_cells, n_rec, v_heads, k_head_dim, v_head_dim] (float32)
    """

    def __init__(self, spec: StateSpec, num_pages: int, num_cells: int,
                 device: torch.device | str = "cpu") -> None:
        if num_pages < 0 or num_cells <= 0:
            raise ValueError(f"need num_pages >= 0 and num_cells > 0, got {num_pages}, {num_cells}")
        self.spec = spec
        self.num_pages = num_pages
        self.num_cells = num_cells
        self.device = torch.device(device)
        self.kv = None
        self.conv = None
        self.ssm = None
        if spec.attention is not None:
            # head-major memory on the CPU: attention reads a sequence's KV in place
            self.kv = layout.new_pool(num_pages, spec.kv_shape(), spec.attention.dtype,
                                      self.device, head_major=self.device.type == "cpu")
        if spec.recurrent is not None:
            r = spec.recurrent
            self.conv = torch.zeros((num_cells, *spec.conv_shape()), dtype=r.conv_dtype,
                                    device=self.device)
            self.ssm = torch.zeros((num_cells, *spec.ssm_shape()), dtype=r.ssm_dtype,
                                   device=self.device)

    def reset_cell(self, cell: int) -> None:
        """A new sequence starts from zero recurrent state."""
        if self.conv is not None:
            self.conv[cell].zero_()
            self.ssm[cell].zero_()

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kv, self.conv, self.ssm)
                   if t is not None)


class CellPool:
    """Recurrent state cells: one per live sequence, never shared."""

    def __init__(self, num_cells: int) -> None:
        if num_cells <= 0:
            raise ValueError(f"num_cells must be positive, got {num_cells}")
        self.num_cells = num_cells
        self._free = list(range(num_cells - 1, -1, -1))
        self._used: set[int] = set()
        self._lock = threading.Lock()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        with self._lock:
            if not self._free:
                raise OutOfCells(f"all {self.num_cells} recurrent state cells are in use")
            cell = self._free.pop()
            self._used.add(cell)
            return cell

    def in_use(self) -> set[int]:
        with self._lock:
            return set(self._used)

    def release(self, cell: int) -> None:
        with self._lock:
            assert cell in self._used, f"release of free cell {cell}"
            self._used.remove(cell)
            self._free.append(cell)

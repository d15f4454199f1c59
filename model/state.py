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
from ckptd.model.window_pages import WindowRooms


class DeviceState:
    """kv   [num_pages, n_attn, 2, block_size, kv_heads, head_dim] (on the CPU a view of
         head-major memory: kernels/paged_attention/layout.py)
    conv [num_cells, n_rec, conv_dim, conv_kernel - 1]
    ssm  [num_cells, n_rec, v_heads, k_head_dim, v_head_dim] (float32)

    With sliding-window layers (spec.attention.windows), `kv` holds the full layers
    only ([num_pages, n_full, ...]) and `kv_win` [num_rooms, n_win, ...] the window
    layers, at the room `rooms` gives a page (model/window_pages.py); `where[i]` is
    attention layer i's (pool, index in it).
    """

    def __init__(self, spec: StateSpec, num_pages: int, num_cells: int,
                 device: torch.device | str = "cpu", num_rooms: int | None = None) -> None:
        if num_pages < 0 or num_cells <= 0:
            raise ValueError(f"need num_pages >= 0 and num_cells > 0, got {num_pages}, {num_cells}")
        self.spec = spec
        self.num_pages = num_pages
        self.num_cells = num_cells
        self.device = torch.device(device)
        self.kv = self.kv_win = self.rooms = None
        self.conv = None
        self.ssm = None
        a = spec.attention
        if a is not None:
            win = a.window_layers
            self.full_layers = [i for i in range(a.n_layers) if i not in win]
            self.window_layers = win
            shape = spec.kv_shape()
            # head-major memory on the CPU: attention reads a sequence's KV in place
            head_major = self.device.type == "cpu"
            self.kv = layout.new_pool(num_pages, (len(self.full_layers), *shape[1:]), a.dtype,
                                      self.device, head_major=head_major)
            self.where = [(self.kv, i) for i in range(a.n_layers)]
            if win:
                rooms = num_pages if num_rooms is None else min(num_rooms, num_pages)
                self.rooms = WindowRooms(num_pages, rooms)
                self.kv_win = layout.new_pool(rooms, (len(win), *shape[1:]), a.dtype,
                                              self.device, head_major=head_major)
                for j, i in enumerate(self.full_layers):
                    self.where[i] = (self.kv, j)
                for j, i in enumerate(win):
                    self.where[i] = (self.kv_win, j)
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
        return sum(t.numel() * t.element_size()
                   for t in (self.kv, self.kv_win, self.conv, self.ssm) if t is not None)


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

"""Device-resident sequence state: the KV page pool and recurrent state slots.

Layouts are the ones model/spec.py fixes. This module owns the tensors and the
slot bookkeeping (one slot per live sequence, never shared); which pages a
sequence holds, and the refcounts of shared ones, are the cache's device tier
(cache/device.py).
"""

from __future__ import annotations

import threading

import torch

from ckptd.kernels.paged_attention import layout
from ckptd.model.spec import OutOfSlots, StateSpec


class DeviceState:
    """kv   [num_pages, n_attn, 2, block_size, kv_heads, head_dim] (on the CPU a view of
         head-major memory: kernels/paged_attention/layout.py)
    conv [num_slots, n_rec, conv_dim, conv_kernel - 1]
    ssm  [num_slots, n_rec, v_heads, k_head_dim, v_head_dim] (float32)
    """

    def __init__(self, spec: StateSpec, num_pages: int, num_slots: int,
                 device: torch.device | str = "cpu") -> None:
        if num_pages < 0 or num_slots <= 0:
            raise ValueError(f"need num_pages >= 0 and num_slots > 0, got {num_pages}, {num_slots}")
        self.spec = spec
        self.num_pages = num_pages
        self.num_slots = num_slots
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
            self.conv = torch.zeros((num_slots, *spec.conv_shape()), dtype=r.conv_dtype,
                                    device=self.device)
            self.ssm = torch.zeros((num_slots, *spec.ssm_shape()), dtype=r.ssm_dtype,
                                   device=self.device)

    def reset_slot(self, slot: int) -> None:
        """A new sequence starts from zero recurrent state."""
        if self.conv is not None:
            self.conv[slot].zero_()
            self.ssm[slot].zero_()

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kv, self.conv, self.ssm)
                   if t is not None)


class SlotPool:
    """Recurrent state slots: one per live sequence, never shared."""

    def __init__(self, num_slots: int) -> None:
        if num_slots <= 0:
            raise ValueError(f"num_slots must be positive, got {num_slots}")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))
        self._used: set[int] = set()
        self._lock = threading.Lock()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        with self._lock:
            if not self._free:
                raise OutOfSlots(f"all {self.num_slots} recurrent state slots are in use")
            slot = self._free.pop()
            self._used.add(slot)
            return slot

    def in_use(self) -> set[int]:
        with self._lock:
            return set(self._used)

    def release(self, slot: int) -> None:
        with self._lock:
            assert slot in self._used, f"release of free slot {slot}"
            self._used.remove(slot)
            self._free.append(slot)

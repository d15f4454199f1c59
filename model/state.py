"""Device-resident sequence state: the KV page pool and recurrent state slots.

Layouts are the ones model/spec.py fixes. Page and slot bookkeeping
(allocation, refcounts, prefix sharing) lives in model/pages.py; this module
only owns the tensors.
"""

from __future__ import annotations

import torch

from ckptd.kernels.paged_attention import layout
from ckptd.model.spec import StateSpec


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

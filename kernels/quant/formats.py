"""GGML's weight formats and a tensor kept in one of them.

A GGUF row of `cols` values is stored as cols / block_size blocks of type_size bytes
each (ggml-common.h); a QuantTensor keeps those bytes, [*lead, rows, row_bytes]
uint8, usually a view of the memory-mapped file, and its logical shape
[*lead, rows, cols]. Kept formats: the block types llama.cpp's Q4_0 .. Q6_K files
(Q4_K_M / Q5_K_M mixes included) use, and F16 / BF16 (F32 is just a tensor).

    qt = QuantTensor(data, "Q4_K", (rows, cols))
    qt.dequantize()          # fp32 [rows, cols], kernels/quant/naive.py
    qt.take_rows(index)      # the rows of a permutation (llama's q/k unpermute)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# name -> (GGML type id, values per block, bytes per block)
FORMATS = {
    "F16": (1, 1, 2), "BF16": (30, 1, 2),
    "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q8_0": (8, 32, 34),
    "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210),
}
BY_ID = {v[0]: k for k, v in FORMATS.items()}


@dataclass(frozen=True)
class QuantTensor:
    data: torch.Tensor          # uint8 [*lead, rows, row_bytes]
    fmt: str                    # a key of FORMATS
    shape: tuple[int, ...]      # logical [*lead, rows, cols]

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"unsupported weight format {self.fmt!r} "
                             f"(kept: {', '.join(FORMATS)})")
        _, bs, ts = FORMATS[self.fmt]
        cols = self.shape[-1]
        if cols % bs:
            raise ValueError(f"{self.fmt} rows hold whole blocks of {bs} values; "
                             f"a row of {cols} does not")
        want = (*self.shape[:-1], cols // bs * ts)
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != want:
            raise ValueError(f"{self.fmt} data for shape {self.shape} must be uint8 {want}, "
                             f"got {self.data.dtype} {tuple(self.data.shape)}")

    @property
    def block(self) -> tuple[int, int]:
        """(values per block, bytes per block)."""
        return FORMATS[self.fmt][1:]

    @property
    def row_bytes(self) -> int:
        return self.data.shape[-1]

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    @property
    def device(self) -> torch.device:
        return self.data.device

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        from ckptd.kernels.quant.naive import dequantize
        return dequantize(self.data, self.fmt, self.shape[-1]).to(dtype)

    def take_rows(self, index: torch.Tensor) -> QuantTensor:
        """Rows `index` (of the last-but-one dim) of a 2-D tensor: whole rows are whole
        blocks, so a row permutation is a permutation of byte rows."""
        if self.data.dim() != 2:
            raise ValueError("take_rows works on 2-D weights")
        return QuantTensor(self.data[index.long()].contiguous(), self.fmt,
                           (int(index.numel()), self.shape[-1]))

    def expert(self, e: int) -> QuantTensor:
        """Expert e of a 3-D [E, rows, cols] tensor."""
        return QuantTensor(self.data[e], self.fmt, self.shape[1:])

    def to(self, device: torch.device | str) -> QuantTensor:
        return QuantTensor(self.data.to(device), self.fmt, self.shape)


def cat_rows(parts: list[QuantTensor]) -> QuantTensor:
    """One tensor of the rows of 2-D tensors of one format (fused projections)."""
    fmts = {p.fmt for p in parts}
    if len(fmts) != 1 or len({p.shape[-1] for p in parts}) != 1:
        raise ValueError("cat_rows needs 2-D tensors of one format and width")
    rows = sum(p.shape[0] for p in parts)
    return QuantTensor(torch.cat([p.data for p in parts]), parts[0].fmt,
                       (rows, parts[0].shape[-1]))

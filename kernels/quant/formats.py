"""GGML's weight formats and a tensor kept in one of them.

A GGUF row of `cols` values is stored as cols / block_size blocks of type_size bytes
each (ggml-common.h); a QuantTensor keeps those bytes, [*lead, rows, row_bytes]
uint8, usually a view of the memory-mapped file, and its logical shape
[*lead, rows, cols]. Kept formats: the block types llama.cpp's Q4_0 .. Q6_K files
(Q4_K_M / Q5_K_M mixes included) use, and F16 / BF16 (F32 is just a tensor).

    qt = QuantTensor(data, "Q4_K", (rows, cols))
    qt.dequantize()          # fp32 [rows, cols]
    qt.take_rows(index)      # the rows of a permutation (llama's q/k unpermute)

Each block format's decoder is here too, in plain torch with the `gguf` package's
formulas (naive.py's reference ops and QuantTensor.dequantize stand on it).
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

_U8 = torch.uint8


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] little-endian fp16 bytes -> fp32 [n, 1]."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """qs [n, groups * width] -> [n, 2 * groups, width]: per group, low nibbles then high."""
    # shifts by Python numbers, not a tensor made from a list: that is a host -> device
    # copy, refused while a CUDA graph is captured (the decode graph embeds tokens)
    q = qs.reshape(qs.shape[0], groups, 1, width)
    return torch.cat([q & 0x0F, q >> 4], dim=2).reshape(qs.shape[0], 2 * groups, width)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 bytes of 6-bit scales and mins -> (sc, min) [n, 8]."""
    s = s.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _q4_0(b):
    d = _f16(b[:, :2])
    q = _nibbles(b[:, 2:], 1, 16).reshape(-1, 32).to(torch.int8) - 8
    return d * q.float()


def _q4_1(b):
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    return d * _nibbles(b[:, 4:], 1, 16).reshape(-1, 32).float() + m


def _q8_0(b):
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, :2])


def _q4_k(b):
    n = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc.float()).reshape(n, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn.float()).reshape(n, 8, 1)
    return (d * _nibbles(b[:, 16:], 4, 32).float() - dm).reshape(n, 256)


def _q5_k(b):
    n = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc.float()).reshape(n, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn.float()).reshape(n, 8, 1)
    qh = b[:, 16:48].reshape(n, 1, 1, 32) >> torch.arange(8, dtype=_U8, device=b.device).view(
        1, 1, 8, 1)
    q = _nibbles(b[:, 48:], 4, 32) | ((qh & 0x01).reshape(n, 8, 32) << 4)
    return (d * q.float() - dm).reshape(n, 256)


def _q6_k(b):
    n = b.shape[0]
    ql = _nibbles(b[:, :128], 2, 64).reshape(n, 8, 32)
    h = b[:, 128:192].reshape(n, 2, 1, 32)
    qh = torch.cat([h, h >> 2, h >> 4, h >> 6], dim=2)
    q = (ql | ((qh & 0x03).reshape(n, 8, 32) << 4)).to(torch.int8) - 32
    d = (_f16(b[:, 208:210]) * b[:, 192:208].contiguous().view(torch.int8).float())
    return (d.reshape(n, 16, 1) * q.reshape(n, 16, 16).float()).reshape(n, 256)


_BLOCKS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k,
           "Q6_K": _q6_k}


def dequantize(data: torch.Tensor, fmt: str, cols: int) -> torch.Tensor:
    """uint8 [..., row_bytes] of rows of `cols` values in `fmt` -> fp32 [..., cols]."""
    lead = data.shape[:-1]
    if fmt in ("F16", "BF16"):
        dt = torch.float16 if fmt == "F16" else torch.bfloat16
        return data.contiguous().view(dt).float().reshape(*lead, cols)
    _, bs, ts = FORMATS[fmt]
    blocks = data.reshape(-1, ts)
    return _BLOCKS[fmt](blocks).reshape(*lead, cols)


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

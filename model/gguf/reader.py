"""The GGUF primitives every converter reads through: open a file, read its metadata,
and its tensors by name.

    reader = open_gguf("model.gguf")             # a gguf.GGUFReader over the mapped file
    field(reader, "general.architecture")        # a metadata value, or a default
    tensors = GGUFTensors(reader, path)          # views of the mapping, or fp32

GGUF lists dimensions fastest first; the reader's numpy arrays are already in torch
order. With `--weights keep`, a tensor of a kept type is handed out as stored
(`GGUFTensors.stored`: a QuantTensor over the mapped bytes, kernels/quant/formats.py).
This module imports no other of model/gguf/: the converters (load.py, qwen35.py,
experts.py), the tokenizer's vocabulary (vocab.py) and LoRA adapters stand on it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch

from ckptd.kernels.quant.formats import FORMATS, QuantTensor
from ckptd.model.checkpoint import Recipe, plain
from ckptd.model.weights import drop_pages, view

KEPT = tuple(FORMATS)          # F16, BF16 and the block formats; F32 is a plain view
_STRING, _ARRAY = gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY


class _Reader(gguf.GGUFReader):
    """gguf.GGUFReader with its metadata arrays read in one pass. The library reads an
    array element by element, each through a few np.memmap slices (tens of us each):
    SmolLM2's 49K tokens and 48K merges took 4-5 CPU-s of a 10-CPU-s daemon start. Here
    each element is one slice of a plain ndarray over the same mapping, and a string's
    length is read with struct; the fields are the library's own (same parts, same
    data indices, same contents())."""

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        if raw_type != _ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype, alen = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
        itype, n = gguf.GGUFValueType(raw_itype[0]), int(alen[0])
        nptype = self.gguf_scalar_to_np.get(itype)
        if itype != _STRING and nptype is None:            # arrays of arrays: the library's
            return super()._get_field_parts(orig_offs, raw_type)
        plain = self.data.view(np.ndarray)
        offs = orig_offs + 12
        parts: list = [raw_itype, alen]
        if nptype is not None:
            size = np.dtype(nptype).itemsize
            parts += list(plain[offs:offs + n * size].view(nptype).reshape(n, 1))
            return 12 + n * size, parts, list(range(2, 2 + n)), [_ARRAY, itype]
        mv = memoryview(plain)
        for _ in range(n):
            (length,) = struct.unpack_from("=Q", mv, offs)
            parts += [plain[offs:offs + 8].view(np.uint64), plain[offs + 8:offs + 8 + length]]
            offs += 8 + length
        return offs - orig_offs, parts, list(range(3, 2 + 2 * n, 2)), [_ARRAY, _STRING]


def open_gguf(path: str | Path):
    """A gguf.GGUFReader; FileNotFoundError, or ValueError for a file that is not a
    readable GGUF (bad magic, truncated)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such GGUF file: {path}")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (bad magic)")
    try:
        # copy-on-write: tensors view the mapping writable, and nothing writes them
        return _Reader(str(path), "c")
    except Exception as e:  # truncation surfaces as ValueError, IndexError, struct.error, ...
        raise ValueError(f"cannot read GGUF {path} (truncated or corrupt?): "
                         f"{type(e).__name__}: {e}") from None


def field(reader, name: str, default=None):
    """A metadata value (scalar, str or list), or default when absent."""
    f = reader.fields.get(name)
    return default if f is None else f.contents()


def need_field(reader, arch: str, key: str):
    """The metadata value <arch>.<key>; ValueError naming it when absent."""
    v = field(reader, f"{arch}.{key}")
    if v is None:
        raise ValueError(f"{arch} GGUF lacks the metadata key {arch}.{key}")
    return v


def scalar(v) -> float:
    """A float read from fp32 metadata, as its shortest decimal (1e-06, not 9.99999997e-07)."""
    return float(str(np.float32(v)))


class GGUFTensors:
    """A GGUF's tensors by name: views of the mapped file, or dequantized to fp32."""

    def __init__(self, reader, path: str | Path | None = None) -> None:
        self.by_name = {t.name: t for t in reader.tensors}
        self.path = path
        self._mm = getattr(reader.data, "_mmap", None)    # np.memmap's mapping
        self._read = False
        # gguf/kept.py: while a list, kept tensors read are appended here and get()
        # hands out their row numbers instead of their values ([rows, 1]; with probe
        # "rows" or "cols", every element's row or column number, [rows, cols])
        self.row_ids: list | None = None
        self.probe = ""

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def names(self) -> list[str]:
        return list(self.by_name)

    def shape(self, name: str) -> tuple[int, ...]:
        """torch order (GGUF lists dimensions fastest first)."""
        return tuple(int(n) for n in reversed(self.by_name[name].shape.tolist()))

    def get(self, name: str) -> torch.Tensor:
        t = self.by_name.get(name)
        if t is None:
            raise ValueError(f"GGUF {self.path or ''} is missing tensor {name!r}")
        want = self.shape(name)
        self._read = True
        if self.row_ids is not None:
            qt = self.stored(name)
            if qt is not None:
                self.row_ids.append(qt)
                if len(want) != 2:      # experts: experts.py asks kept() for those
                    raise ValueError(f"{name}: a kept {len(want)}-D tensor is not a row set")
                rows = torch.arange(want[0], dtype=torch.float64).view(want[0], 1)
                if self.probe == "rows":
                    return rows.expand(want)         # a view: no memory
                if self.probe == "cols":
                    return torch.arange(want[1], dtype=torch.float64).expand(want)
                return rows
        kind = gguf.GGMLQuantizationType
        dtypes = {kind.F32: torch.float32, kind.F16: torch.float16, kind.BF16: torch.bfloat16}
        if t.tensor_type in dtypes and self._mm is not None:
            return view(self._mm, dtypes[t.tensor_type], int(t.data_offset), want)
        try:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ValueError(f"GGUF tensor {name!r} has type {t.tensor_type.name}, which the "
                             "gguf package cannot dequantize") from None
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32).reshape(want))

    def kept(self, name: str) -> QuantTensor | None:
        """The tensor as stored (a QuantTensor) when kept mode is reading and its type is
        kept, else None."""
        if self.row_ids is None:
            return None
        qt = self.stored(name)
        if qt is not None:
            self.row_ids.append(qt)
        return qt

    def stored(self, name: str) -> QuantTensor | None:
        """The tensor as stored, when its type is kept: uint8 [*lead, rows, row_bytes]
        over the mapped file."""
        t = self.by_name[name]
        kind = t.tensor_type.name
        if kind not in KEPT or self._mm is None:
            return None
        shape = self.shape(name)
        _, bs, ts = FORMATS[kind]
        row_bytes = shape[-1] // bs * ts
        data = view(self._mm, torch.uint8, int(t.data_offset), (*shape[:-1], row_bytes))
        return QuantTensor(data, kind, shape)

    def release(self, everything: bool = False) -> None:
        """Drop the file's mapped pages (after a read, or always with everything): the
        whole file, as model/weights.py does and for the same reason."""
        if self._mm is not None and (everything or self._read):
            drop_pages(self._mm, [(0, len(self._mm))])
        self._read = False


def convert_tensors(tensors: GGUFTensors, n_layers: int, top: dict[str, str],
                    block: Callable[[int, str], list[tuple[str, Recipe]] | None],
                    skip: Callable[[str], bool] = lambda name: False) -> dict[str, Recipe]:
    """A recipe per HF name. `top` maps non-block names; `block(layer, part)` converts
    blk.<layer>.<part> (part includes the .weight/.bias suffix) into (HF name, recipe)
    pairs (none where another part's recipe reads this one too), or None for parts it
    does not know; `skip(name)` drops tensors that are not needed."""
    out: dict[str, Recipe] = {}
    for name in tensors.names():
        if skip(name):
            continue
        stem, _, suffix = name.rpartition(".")
        if stem in top:
            out[f"{top[stem]}.{suffix}"] = plain(lambda name=name: tensors.get(name))
            continue
        parts = name.split(".", 2)
        res = None
        if parts[0] == "blk" and len(parts) == 3 and parts[1].isdigit():
            layer = int(parts[1])
            if layer >= n_layers:
                raise ValueError(f"GGUF tensor {name!r} is past the model's {n_layers} layers")
            res = block(layer, parts[2])
        if res is None:
            raise ValueError(f"unexpected tensor {name!r} in GGUF {tensors.path or ''}")
        out.update(res)
    return out


def require(tensors: GGUFTensors, names: list[str]) -> None:
    """ValueError naming the first absent tensor."""
    for name in names:
        if name not in tensors:
            raise ValueError(f"GGUF {tensors.path or ''} is missing tensor {name!r}")


def unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation. Per head of d rows the converter stores
    row (half h, index i) of the rotate-half layout at position 2i + h; rows [n_heads*d, ...]
    (a bias too)."""
    rows = w.shape[0]
    d = rows // n_heads
    rest = w.shape[1:]
    return w.reshape(n_heads, d // 2, 2, *rest).transpose(1, 2).reshape(rows, *rest)

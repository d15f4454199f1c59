"""`--weights keep` for GGUF files: recipes that hand the loader the tensors as the file
stores them (kernels/quant/formats.py: QuantTensor, a view of the mapped file) instead
of fp32.

The converters (load.py, qwen35.py, experts.py) write each HF tensor as a recipe over
GGUF tensors; the only transforms they apply to 2-D weights are row permutations and
row selections (llama's q/k unpermute, Qwen3.5's value-head untiling, Qwen3-Next's
split of in_proj_qkvz). A recipe is run once with every kept tensor it reads replaced
by its row numbers ([rows, 1]); what comes out says which rows of the stored tensor
the parameter is, and those rows are taken from the kept bytes (whole rows are whole
blocks). Where that fails, it is run twice more, the tensor given as every element's
row number, then its column number: a permutation of whole columns with the rows
untouched (Qwen3.5's out_proj) stays kept as KeptColumns (model/quant.py), its input
permuted at run time.
A recipe that does anything else with a kept tensor (a value change, two tensors at
once) is run again normally: that parameter is expanded to fp32, logged once per load.
"""

from __future__ import annotations

import logging

import gguf
import torch

from ckptd.kernels.quant.formats import QuantTensor
from ckptd.model.checkpoint import Recipe
from ckptd.model.gguf.reader import KEPT, GGUFTensors
from ckptd.model.quant import KeptColumns, KeptGateUp

log = logging.getLogger("ckptd.model")

PLAIN = ("F32",)


def check_types(tensors: GGUFTensors, keep: bool) -> None:
    """Before any weight is read: ValueError naming the first tensor whose type this
    mode cannot serve (one line)."""
    for name, t in tensors.by_name.items():
        kind = t.tensor_type.name
        if kind in PLAIN or kind in ("F16", "BF16") or (keep and kind in KEPT):
            continue
        if not keep and t.tensor_type in gguf.quants._type_traits:
            continue
        if keep:
            raise ValueError(f"GGUF tensor {name!r} has type {kind}, which --weights keep "
                             f"does not support (kept: {', '.join(KEPT)}, F32); "
                             "--weights expand dequantizes it to fp32 where the gguf "
                             "package can")
        raise ValueError(f"GGUF tensor {name!r} has type {kind}, which the gguf package "
                         "cannot dequantize")


def kept_recipes(tensors: GGUFTensors, recipes: dict[str, Recipe]) -> dict[str, Recipe]:
    """The recipes, each returning a QuantTensor where its tensor can stay kept."""
    return {name: _kept(tensors, name, r) for name, r in recipes.items()}


def _kept(tensors: GGUFTensors, name: str, recipe: Recipe) -> Recipe:
    def probe(dtype: torch.dtype, device: torch.device, grid: str = ""):
        """(the recipe's result with kept tensors as row numbers [rows, 1], or with
        `grid` "rows" / "cols" every element's row / column number; the kept tensors
        read)"""
        tensors.row_ids, tensors.probe = [], grid
        try:
            out = recipe(dtype, device)
        except (RuntimeError, ValueError, IndexError):
            out = None                  # not a row transform: expanded below
        finally:
            reads, tensors.row_ids, tensors.probe = tensors.row_ids, None, ""
        return out, reads

    def run(dtype: torch.dtype, device: torch.device):
        out, reads = probe(dtype, device)
        if not reads:                   # nothing kept read: the plain result
            return out if out is not None else recipe(dtype, device)
        if isinstance(out, (QuantTensor, KeptGateUp)):
            return out                  # experts.py built it from the kept tensors
        if dtype not in (torch.float32, torch.float64):
            out, reads = probe(torch.float64, torch.device("cpu"))   # exact row numbers
        rows = _row_selection(out, reads)
        if rows is None and len(reads) == 1 and reads[0].data.dim() == 2:
            cpu = torch.device("cpu")
            columns = _column_permutation(probe(torch.float64, cpu, "rows")[0],
                                          probe(torch.float64, cpu, "cols")[0], reads[0])
            if columns is not None:
                return KeptColumns(reads[0], columns)
        if rows is None:
            log.info("%s: expanded to %s (its conversion is not a row selection)", name, dtype)
            return recipe(dtype, device)
        qt = reads[0]
        if rows.numel() == qt.shape[0] and torch.equal(rows, torch.arange(qt.shape[0])):
            return qt                   # the stored rows as they are: the mapped bytes
        return qt.take_rows(rows)
    return run


def _row_selection(ids, reads: list[QuantTensor]) -> torch.Tensor | None:
    """The row numbers `ids` stands for, when it is a selection of distinct rows of the
    one 2-D kept tensor read."""
    if len(reads) != 1 or reads[0].data.dim() != 2 or not isinstance(ids, torch.Tensor):
        return None
    if ids.dim() != 2 or ids.shape[1] != 1 or ids.numel() == 0:
        return None
    rows = ids[:, 0].double().cpu()
    if not torch.equal(rows, rows.round()) or rows.min() < 0 or rows.max() >= reads[0].shape[0]:
        return None
    rows = rows.long()
    return rows if rows.unique().numel() == rows.numel() else None


def _column_permutation(row_of, col_of, qt: QuantTensor) -> torch.Tensor | None:
    """The stored column of each parameter column, when the recipe's results for the
    row-number and column-number grids say it kept every row in place and moved whole
    columns: row_of[i, j] == i and col_of[i, j] == columns[j] on every row."""
    rows, cols = qt.shape
    for t in (row_of, col_of):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (rows, cols) or \
                t.dtype != torch.float64:
            return None
    if not torch.equal(row_of, torch.arange(rows, dtype=torch.float64)
                       .view(rows, 1).expand(rows, cols)):
        return None
    if not torch.equal(col_of, col_of[:1].expand(rows, cols)):
        return None
    columns = col_of[0]
    if not torch.equal(columns.sort().values, torch.arange(cols, dtype=torch.float64)):
        return None                     # not every column once, or not whole numbers
    return columns.long()


"""Where a model runs and in which dtype: `--device auto|cpu|cuda|cuda:N` and
`--dtype auto|bfloat16|float16|float32`.

auto picks CUDA with bf16 when a CUDA device is there, else the CPU with fp32. A
name is checked without torch (`check_names`), so a typo is refused before torch is
imported; `resolve` then checks that the device exists: `--device cuda` on a machine
without CUDA is one ValueError, never a crash at the first kernel.
"""

from __future__ import annotations

import re
import types
from dataclasses import dataclass, fields, is_dataclass

DEVICE_NAMES = "auto, cpu, cuda or cuda:N"
DTYPE_NAMES = ("auto", "bfloat16", "float16", "float32")
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_names(device: str, dtype: str) -> None:
    """ValueError naming the flag when a device or dtype name is not one we know."""
    if not isinstance(device, str) or not _DEVICE.match(device):
        raise ValueError(f"--device must be {DEVICE_NAMES}, got {device!r}")
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")


@dataclass(frozen=True)
class Placement:
    device: object    # torch.device
    dtype: object     # torch.dtype

    def __str__(self) -> str:
        return f"{self.device} {str(self.dtype).removeprefix('torch.')}"


def resolve(device: str = "auto", dtype: str = "auto") -> Placement:
    """The torch device and dtype the names stand for, on this machine."""
    check_names(device, dtype)
    import torch  # here: check_names serves the flags without torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None \
                else "no CUDA device is visible"
            raise ValueError(f"--device {device}: {why} (torch {torch.__version__}); "
                             "use --device cpu")
        n = torch.cuda.device_count()
        index = 0 if dev.index is None else dev.index
        if index >= n:
            raise ValueError(f"--device {device}: this machine has {n} CUDA device(s), "
                             f"cuda:0..cuda:{n - 1}")
        dev = torch.device("cuda", index)
    if dtype == "auto":
        dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    else:
        dt = getattr(torch, dtype)
    return Placement(dev, dt)


def stray_tensors(model, device) -> list[str]:
    """Every tensor the model holds that is not on `device`, by where it is held:
    parameters and buffers, and what modules keep besides (kept GGUF bytes, fused and
    packed weights, index tensors). Empty when the model is all on its device."""
    import torch  # here: check_names serves the flags without torch
    from torch import nn

    device = torch.device(device)
    seen: set[int] = set()
    strays: list[str] = []

    def visit(value, where: str, depth: int = 0) -> None:
        if id(value) in seen or depth > 6 or isinstance(
                value, (nn.Module, str, bytes, type, types.FunctionType, types.MethodType)):
            return          # a module is walked on its own; a bound method is its module's
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            if value.device.type != device.type or \
                    device.index not in (None, value.device.index):
                strays.append(f"{where} ({value.device})")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                visit(v, f"{where}[{i}]", depth + 1)
        elif isinstance(value, dict):
            for k, v in value.items():
                visit(v, f"{where}.{k}", depth + 1)
        elif hasattr(value, "__dict__") or is_dataclass(value):
            names = [f.name for f in fields(value)] if is_dataclass(value) else vars(value)
            for k in names:
                visit(getattr(value, k), f"{where}.{k}", depth + 1)

    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        for k, v in vars(module).items():
            if k in ("_parameters", "_buffers"):
                visit(v, prefix.rstrip("."))
            elif not k.startswith("_"):
                visit(v, prefix + k)
    return strays

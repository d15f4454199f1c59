"""A decode step's forward copies nothing from host memory to the device.

On CUDA a decode step runs as a captured graph (model/graphs.py), and a capture refuses a
copy from pageable host memory: on the lent H200 (2026-11-27) every request of the
full-size kept Q4_K_M model failed at its first decode, because the kept embedding's
dequantization built its shift constants with `torch.tensor([...], device=...)`. No GPU
is needed to see it: the model runs on the meta device with every op routed to its
Triton launcher (the compile gate's capture), and each way a tensor comes from host
memory into the forward (torch.tensor / as_tensor / new_tensor on the device, `.to` or
`.copy_` from a CPU tensor of more than one element) is recorded.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from ckptd.kernels.launch import GATE_TARGETS
from ckptd.tools.gate.capture import capture
from ckptd.tools.gate.models import KEPT_MODELS, MODELS, STEPS
from ckptd.tools.gate.steps import meta_model, run_step

_MADE = {"tensor", "as_tensor", "new_tensor"}
_MOVED = {"to", "copy_", "cuda"}


def _host(t) -> bool:
    # a 0-dim CPU tensor in a device op is passed as a number: a capture allows it
    return isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() > 0


class HostCopies(TorchFunctionMode):
    """Records each host -> device copy made inside the mode: (what, its shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self.on = True          # off outside the model's forward (the step's inputs)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        on_device = isinstance(out, torch.Tensor) and out.device.type != "cpu"
        data = args[1] if name in ("new_tensor", "copy_") and len(args) > 1 else (
            args[0] if args else None)
        from_host = not isinstance(data, torch.Tensor) or _host(data)
        if self.on and on_device and from_host and (name in _MADE or (
                name in _MOVED and (name == "copy_" or _host(args[0])))):
            self.seen.append(f"{name} {tuple(out.shape)}")
        return out


def _decode_copies(model) -> list[str]:
    decode = [s for name, s in STEPS.items() if name.startswith("decode")]
    mode = HostCopies()
    mode.on = False
    model.register_forward_pre_hook(lambda *_: setattr(mode, "on", True))
    model.register_forward_hook(lambda *_: setattr(mode, "on", False))
    with mode:
        capture(lambda: [run_step(model, step) for step in decode], GATE_TARGETS[-1])
    return mode.seen


def test_the_mode_sees_a_host_copy():
    with HostCopies() as mode:
        torch.tensor([0, 4], dtype=torch.uint8, device="meta")
        torch.ones(3).to("meta")
        torch.empty(2, device="meta").copy_(torch.ones(2))
        torch.empty(2, device="meta") + torch.tensor(1.0)      # a number: allowed
    assert mode.seen == ["tensor (2,)", "to (3,)", "copy_ (2,)"]


@pytest.mark.parametrize("fmt", ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1"])
def test_a_kept_models_decode_makes_no_host_copy(fmt):
    model = meta_model(MODELS[KEPT_MODELS[0]], torch.bfloat16, fmt)
    assert _decode_copies(model) == []


def test_a_plain_models_decode_makes_no_host_copy():
    assert _decode_copies(meta_model(MODELS["qwen3.5-35b-a3b"], torch.bfloat16)) == []

"""Kept weights live where the model runs, checked on the meta device (no GPU needed).

A kept GGUF tensor is a view of the mapped file; the loader moves it to the model's
device and the model's .to() moves it with the rest (model/quant.py). On the meta device
a tensor left on the CPU shows: `stray_tensors` finds every tensor the model holds off
its device, and a step on the CUDA path (its launches recorded, tools/gate/capture.py)
under a dispatch mode shows that every op's operands and every kernel's arguments share
one device. Both for the committed kept fixture (a hybrid in every block format) and for
a kept MoE model that llama.cpp's converter wrote (Q8_0 experts).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ckptd.kernels import launch
from ckptd.model.loader import load_model
from ckptd.model.placement import stray_tensors
from ckptd.model.quant import KeptEmbedding, KeptExperts, KeptLinear
from ckptd.tools.fetch_llamacpp import Conversion, convert
from ckptd.tools.gate.capture import capture
from ckptd.tools.gate.steps import run_step
from tests.kernels.quant_data import FIXTURE

STEPS = ([(0, 20), (0, 9)], [(20, 1), (9, 3)])      # two prefills, then a decode and a chunk


class OneDevice(TorchDispatchMode):
    """Records ops whose tensor operands are on more than one device (a 0-dim CPU tensor
    is a scalar any device takes)."""

    def __init__(self):
        super().__init__()
        self.mixed: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat = torch.utils._pytree.tree_leaves((args, kwargs or {}))
        devices = {t.device for t in flat if isinstance(t, torch.Tensor)
                   and not (t.device.type == "cpu" and t.dim() == 0)}
        if len(devices) > 1:
            self.mixed.append(f"{func.__name__}: {sorted(map(str, devices))}")
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def kept_moe_gguf(moe_reference_dirs, llamacpp, tmp_path_factory):
    out = tmp_path_factory.mktemp("kept-moe") / "moe-q8.gguf"
    convert(llamacpp, [Conversion(moe_reference_dirs["moe-nested"], out, "q8_0", ("--no-mtp",))],
            tokenizer_pre="gpt-2")
    return out


def _kinds(model) -> set[type]:
    return {type(m) for m in model.modules()} & {KeptLinear, KeptEmbedding, KeptExperts}


def _one_device_steps(model) -> list[str]:
    """The CUDA path's steps of model on the meta device: ops with mixed operands."""
    with OneDevice() as mode:
        launches = capture(lambda: [run_step(model, s) for s in STEPS], launch.DEFAULT)
    assert launches                                       # the Triton path ran
    return mode.mixed


@pytest.mark.parametrize("how", ["loaded", "moved"])
def test_kept_fixture_on_meta(how):
    model = load_model(FIXTURE, device="meta") if how == "loaded" else \
        load_model(FIXTURE).to("meta")
    assert _kinds(model) == {KeptLinear, KeptEmbedding}
    assert stray_tensors(model, "meta") == []
    assert _one_device_steps(model) == []


@pytest.mark.parametrize("how", ["loaded", "moved"])
def test_kept_moe_on_meta(how, kept_moe_gguf):
    model = load_model(kept_moe_gguf, device="meta") if how == "loaded" else \
        load_model(kept_moe_gguf).to("meta")
    assert KeptExperts in _kinds(model)
    assert stray_tensors(model, "meta") == []
    assert _one_device_steps(model) == []


def test_stray_tensors_names_what_stays_behind():
    model = load_model(FIXTURE)
    assert stray_tensors(model, "cpu") == []
    behind = stray_tensors(model, "meta")
    assert any("embed_tokens.qweight.data" in s for s in behind)
    assert all(s.endswith("(cpu)") for s in behind)


def test_to_dtype_leaves_kept_bytes_and_changes_the_embedding_dtype():
    model = load_model(FIXTURE).to(torch.bfloat16)
    emb = model.model.embed_tokens
    assert emb.qweight.data.dtype == torch.uint8 and emb.dtype == torch.bfloat16
    assert emb(torch.tensor([1, 2])).dtype == torch.bfloat16

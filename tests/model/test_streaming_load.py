"""Loading streams the checkpoint tensor by tensor: each is read from the mapped file,
converted and placed on the model's device, and its pages dropped before the next, so
the host holds about one tensor besides what the device keeps.

Without a GPU the device is the host, so the check is that a float32 checkpoint loaded
as bfloat16 grows RSS by the bf16 model plus about one tensor, where reading the whole
checkpoint first would take 1.5x the model at least. On the meta device (tensors with
no memory) the load must take nothing but about one tensor. A child process measures
its own peak RSS (VmHWM, reset first)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from ckptd.model.arch.decoder import CausalLM
from ckptd.model.config import ModelConfig
from ckptd.tools.make_tiny import _config

CHILD = r"""
import json, sys
from pathlib import Path
import torch
from ckptd.model.loader import load_model

def kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

load_model(sys.argv[1] + "/warm", torch.bfloat16, device=sys.argv[2])   # imports, allocator
Path("/proc/self/clear_refs").write_text("5")                           # VmHWM := VmRSS
before = kib("VmRSS")
model = load_model(sys.argv[1] + "/big", torch.bfloat16, device=sys.argv[2])
assert model.device.type == sys.argv[2] and model.dtype == torch.bfloat16
print(json.dumps({"growth": kib("VmHWM") - before}))
"""


def _checkpoint(folder, layers: int, hidden: int) -> int:
    """A llama checkpoint of random fp32 weights: (largest tensor, all) in bytes."""
    cfg = {**_config("llama"), "hidden_size": hidden, "intermediate_size": 3 * hidden,
           "num_hidden_layers": layers, "num_attention_heads": 8, "num_key_value_heads": 4,
           "head_dim": hidden // 8, "vocab_size": 4096}
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in CausalLM(ModelConfig.from_hf(cfg)).state_dict().items()}
    g = torch.Generator().manual_seed(0)
    weights = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
    save_file(weights, str(folder / "model.safetensors"))
    return max(t.nbytes for t in weights.values()), sum(t.nbytes for t in weights.values())


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_loading_streams_tensor_by_tensor(device, tmp_path):
    _checkpoint(tmp_path / "warm", 1, 64)
    largest, file_bytes = _checkpoint(tmp_path / "big", 12, 768)      # ~360 MB fp32
    p = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), device],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    growth = json.loads(p.stdout.splitlines()[-1])["growth"]
    kept = file_bytes // 2 if device == "cpu" else 0                 # the bf16 model
    assert growth <= kept + 2 * largest + (16 << 20), (growth, largest, file_bytes)

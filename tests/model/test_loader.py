"""Bad checkpoints fail with a message that names the problem."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckptd.model.loader import load_model


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")


def test_unsupported_architecture(tiny_llama_dir, tmp_path):
    d = _copy(tiny_llama_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported architecture.*gpt_neox"):
        load_model(d)


def test_truncated_safetensors(tiny_llama_dir, tmp_path):
    d = _copy(tiny_llama_dir, tmp_path / "m")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        load_model(d)


def test_missing_tensor(tiny_hybrid_dir, tmp_path):
    d = _copy(tiny_hybrid_dir, tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.linear_attn.A_log"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ValueError, match="missing.*model.layers.1.linear_attn.A_log"):
        load_model(d)


def test_wrong_shape(tiny_hybrid_dir, tmp_path):
    d = _copy(tiny_hybrid_dir, tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    tensors["model.norm.weight"] = torch.zeros(7)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.norm.weight has shape \(7,\)"):
        load_model(d)


def test_nested_language_model_names_load(tiny_hybrid_dir, tmp_path):
    d = _copy(tiny_hybrid_dir, tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in tensors.items()}
    save_file(renamed, d / "model.safetensors")
    assert load_model(d).config.arch == "qwen3_5_text"

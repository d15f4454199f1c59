"""Bad checkpoints fail with a message that names the problem."""

from __future__ import annotations

import json
import shutil
import time

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


def _sparse(path, size=100 << 30):
    """A file of `size` bytes that takes no disk: reading it would take minutes."""
    with open(path, "ab") as f:
        f.truncate(size)


def test_unsupported_folder_is_refused_before_any_shard_is_read(tmp_path):
    d = tmp_path / "deepseek"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "deepseek_v3", "hidden_size": 64}))
    shards = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {f"w{i}": s for i, s in enumerate(shards)}}))
    for s in shards:
        _sparse(d / s)
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as e:
        load_model(d)
    assert time.perf_counter() - t0 < 1.0
    msg = str(e.value)
    assert "'deepseek_v3'" in msg and "qwen3_5_moe" in msg and "qwen3_next" in msg
    assert "\n" not in msg


def test_nested_config_without_text_config_is_refused(tmp_path):
    d = _copy_config(tmp_path, {"model_type": "qwen3_5_moe", "vision_config": {}})
    with pytest.raises(ValueError, match="needs a text_config"):
        load_model(d)


def test_unsupported_gguf_is_refused_from_its_header(tmp_path):
    import gguf
    import numpy as np

    from ckptd.model.loader import load
    path = tmp_path / "deepseek.gguf"
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _sparse(path)
    for fn in (load_model, load):
        t0 = time.perf_counter()
        with pytest.raises(ValueError) as e:
            fn(path)
        assert time.perf_counter() - t0 < 1.0
        assert "'deepseek2'" in str(e.value) and "qwen35moe, qwen3next" in str(e.value)


def _copy_config(tmp_path, cfg):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    _sparse(d / "model.safetensors")
    return d


def test_moe_experts_stored_stacked_load_like_per_expert(tiny_moe_dir, tmp_path):
    """Checkpoints that already hold transformers' 3-D expert tensors
    (mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]) load as they are."""
    from ckptd.model.testing import prompt_logits
    d = _copy(tiny_moe_dir, tmp_path / "m")
    w = load_file(d / "model.safetensors")
    for i in range(4):
        p = f"model.layers.{i}.mlp.experts."
        gate = [w.pop(f"{p}{j}.gate_proj.weight") for j in range(8)]
        up = [w.pop(f"{p}{j}.up_proj.weight") for j in range(8)]
        down = [w.pop(f"{p}{j}.down_proj.weight") for j in range(8)]
        w[p + "gate_up_proj"] = torch.stack([torch.cat(gu) for gu in zip(gate, up)])
        w[p + "down_proj"] = torch.stack(down)
    save_file(w, d / "model.safetensors")
    tokens = list(range(3, 90))
    want = prompt_logits(load_model(tiny_moe_dir), tokens)
    assert torch.equal(prompt_logits(load_model(d), tokens), want)


def test_moe_missing_expert_is_named(tiny_moe_dir, tmp_path):
    d = _copy(tiny_moe_dir, tmp_path / "m")
    w = load_file(d / "model.safetensors")
    del w["model.layers.2.mlp.experts.5.up_proj.weight"]
    save_file(w, d / "model.safetensors")
    with pytest.raises(ValueError, match="missing expert tensor "
                                         r"model.layers.2.mlp.experts.5.up_proj.weight"):
        load_model(d)


def test_moe_expert_of_the_wrong_shape_is_named(tiny_moe_dir, tmp_path):
    d = _copy(tiny_moe_dir, tmp_path / "m")
    w = load_file(d / "model.safetensors")
    w["model.layers.1.mlp.experts.3.down_proj.weight"] = torch.zeros(64, 31)
    save_file(w, d / "model.safetensors")
    with pytest.raises(ValueError, match=r"expert 3 of model.layers.1.mlp.experts has shape"):
        load_model(d)

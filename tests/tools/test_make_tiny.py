"""`ckptd make-tiny` writes the MoE architectures as folders transformers loads, and
their GGUFs through llama.cpp's own converter."""

from __future__ import annotations

import json

import pytest
import torch

from ckptd.model.loader import load_model
from ckptd.model.testing import prompt_logits
from ckptd.tools.cli import main

TOKENS = torch.randint(3, 512, (120,), generator=torch.Generator().manual_seed(3)).tolist()


@pytest.mark.parametrize(("arch", "cls"), [("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM"),
                                           ("qwen3_next", "Qwen3NextForCausalLM")])
def test_make_tiny_moe_folder_matches_transformers(arch, cls, tmp_path):
    from transformers import AutoModelForCausalLM

    from ckptd.tools.make_tiny import make_tiny
    folder = make_tiny(arch, tmp_path / arch)
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(ref).__name__ == cls
    with torch.no_grad():
        want = ref(torch.tensor([TOKENS])).logits[0]
    assert (prompt_logits(load_model(folder), TOKENS) - want).abs().max().item() <= 1e-4


def test_make_tiny_cli_writes_a_gguf(tmp_path, capsys):
    folder, gguf = tmp_path / "next", tmp_path / "next.gguf"
    assert main(["make-tiny", "--arch", "qwen3_next", "--out", str(folder),
                 "--gguf", str(gguf)]) == 0
    assert f"and {gguf}" in capsys.readouterr().out
    assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen3_next"
    got = prompt_logits(load_model(gguf), TOKENS)
    assert (got - prompt_logits(load_model(folder), TOKENS)).abs().max().item() <= 1e-4


def test_make_tiny_cli_writes_a_state_space_hybrid_and_its_gguf(tmp_path, capsys):
    """Jamba: transformers' class writes the folder; llama.cpp's converter, which wants a
    Llama vocabulary for it, writes the tiny byte-level one as GPT-2's."""
    from transformers import AutoModelForCausalLM
    folder, gguf = tmp_path / "jamba", tmp_path / "jamba.gguf"
    assert main(["make-tiny", "--arch", "jamba", "--out", str(folder), "--gguf", str(gguf)]) == 0
    assert f"and {gguf}" in capsys.readouterr().out
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(ref).__name__ == "JambaForCausalLM"
    with torch.no_grad():
        want = ref(torch.tensor([TOKENS])).logits[0]
    assert (prompt_logits(load_model(gguf), TOKENS) - want).abs().max().item() <= 1e-4


def test_make_tiny_rejects_an_unknown_arch(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["make-tiny", "--arch", "mixtral", "--out", str(tmp_path / "x")])
    assert "invalid choice: 'mixtral'" in capsys.readouterr().err


def test_make_tiny_vision_writes_a_multimodal_folder(tmp_path, capsys):
    """`--arch qwen3_5 --vision`: transformers' Qwen3_5ForConditionalGeneration layout
    (text under model.language_model, the tower under model.visual) and a processor
    config; ckptd reads both halves."""
    from ckptd.model.vision.load import load_vision_hf
    from ckptd.model.weights import SafetensorsSource
    assert main(["make-tiny", "--arch", "qwen3_5", "--vision", "--out", str(tmp_path)]) == 0
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert (tmp_path / "preprocessor_config.json").is_file()
    names = SafetensorsSource([tmp_path / "model.safetensors"]).names()
    assert any(n.startswith("model.visual.") for n in names)
    assert any(n.startswith("model.language_model.") for n in names)
    assert load_model(tmp_path).config.mrope_section == (2, 1, 1)
    assert load_vision_hf(tmp_path).config.image_token_id == cfg["image_token_id"]

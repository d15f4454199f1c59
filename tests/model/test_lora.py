"""LoRA adapters against transformers + PEFT: a random PEFT adapter for the tiny llama
and the tiny Qwen3.5 hybrid (attention, MLP and Gated DeltaNet projections, value heads
tiled by the converter), converted to GGUF by llama.cpp's own convert_lora_to_gguf.py
and read as a PEFT folder too, gives PEFT's logits at scales 1 and 0.5; scale 0 is the
base model bit for bit; sequences of one step each get their own scales; weights kept
in GGUF formats take adapters too; a wrong adapter is refused, naming what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckptd.model.loader import load_model
from ckptd.model.lora.adapter import read_adapter
from ckptd.model.lora.apply import Lora, LoraMatmul
from ckptd.model.testing import Scratch, prompt_logits
from ckptd.tools.fetch_llamacpp import convert_lora
from ckptd.tools.make_lora import make_lora
from tests.kernels.quant_data import FIXTURE

IDS = list(range(3, 60, 2))
TARGETS = {"llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                     "down_proj"]}
TARGETS["hybrid"] = TARGETS["llama"] + ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
                                        "out_proj"]


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir, tiny_hybrid_dir, tmp_path_factory, llamacpp):
    """{kind: (base folder, PEFT model, PEFT folder, converted GGUF)}."""
    import peft
    import transformers
    root = llamacpp
    out = tmp_path_factory.mktemp("lora")
    cases = {}
    for kind, base in (("llama", Path(tiny_llama_dir)), ("hybrid", Path(tiny_hybrid_dir))):
        torch.manual_seed(1)
        hf = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        conf = peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS[kind],
                               init_lora_weights=False)
        pm = peft.get_peft_model(hf, conf)
        with torch.no_grad():          # B random too (PEFT's default init leaves it zero)
            for name, p in pm.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
        pm.save_pretrained(out / kind)
        conv = base
        if kind == "hybrid":
            # the LoRA converter sizes Qwen3.5's blocks with its MTP layers, which a real
            # config has (mtp_num_hidden_layers = 1) and the tiny one lacks
            conv = out / "hybrid-config"
            conv.mkdir()
            cfg = json.loads((base / "config.json").read_text())
            (conv / "config.json").write_text(json.dumps({**cfg, "mtp_num_hidden_layers": 1}))
        convert_lora(root, conv, out / kind, out / f"{kind}.gguf")
        cases[kind] = (base, pm.eval(), out / kind, out / f"{kind}.gguf")
    return cases


def _peft_logits(pm, ids: list[int], scale: float) -> torch.Tensor:
    import peft
    for m in pm.modules():
        if isinstance(m, peft.tuners.lora.LoraLayer):
            m.set_scale("default", scale)
    with torch.no_grad():
        return pm(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("kind", ["llama", "hybrid"])
def test_lora_logits_match_peft(adapters, kind):
    base, pm, folder, gguf = adapters[kind]
    model = load_model(base)
    plain = prompt_logits(model, IDS)
    Lora([read_adapter(gguf, model), read_adapter(folder, model)]).attach(model)
    assert isinstance(model.model.layers[-1].mlp.down, LoraMatmul)
    for scale in (1.0, 0.5):
        want = _peft_logits(pm, IDS, scale)
        for scales in ((scale, 0.0), (0.0, scale)):          # the GGUF, then the folder
            got = prompt_logits(model, IDS, lora=scales)
            assert (got - want).abs().max().item() <= 1e-4, (scale, scales)
        assert (want - plain).abs().max().item() > 0.1 * scale   # the adapter does change it
    # scale 0 is the base model, bit for bit, and so is a step with no scales at all
    assert torch.equal(prompt_logits(model, IDS, lora=(0.0, 0.0)), plain)
    assert torch.equal(prompt_logits(model, IDS), plain)
    # two adapters at once add up
    both = prompt_logits(model, IDS, lora=(0.5, 0.5))
    assert (both - _peft_logits(pm, IDS, 1.0)).abs().max().item() <= 1e-4


def test_sequences_of_one_step_keep_their_scales(adapters):
    """Prefill and decode of two sequences in shared steps, one with the adapter and one
    without, each equal to its own run alone (the hybrid: its recurrent state too)."""
    base, _, _, gguf = adapters["hybrid"]
    model = load_model(base)
    Lora([read_adapter(gguf, model)]).attach(model)
    a, b = IDS[:17], IDS[3:12]
    s = Scratch(model, 16, 64, n_seqs=2)
    s.feed({0: a, 1: b}, lora={0: (1.0,), 1: (0.0,)})
    mixed = s.feed({0: [5], 1: [7]}, lora={0: (1.0,), 1: (0.0,)})
    for i, (ids, nxt, scale) in enumerate(((a, 5, 1.0), (b, 7, 0.0))):
        alone = Scratch(model, 16, 64)
        alone.feed({0: ids}, lora={0: (scale,)})
        want = alone.feed({0: [nxt]}, lora={0: (scale,)})
        assert (mixed[i] - want[0]).abs().max().item() <= 1e-5


def test_kept_weights_take_an_adapter(tmp_path):
    """The quantized fixture kept in its formats and expanded to fp32: the same adapter
    changes both the same way."""
    kept, expanded = load_model(FIXTURE, weights="keep"), load_model(FIXTURE, weights="expand")
    folder = make_lora(expanded, tmp_path / "a", targets=tuple(TARGETS["hybrid"]), std=0.2)
    for m in (kept, expanded):
        Lora([read_adapter(folder, m)]).attach(m)
    ids = IDS[:20]
    k1, e1 = prompt_logits(kept, ids, lora=(1.0,)), prompt_logits(expanded, ids, lora=(1.0,))
    k0 = prompt_logits(kept, ids)
    assert (k1 - e1).abs().max().item() <= 2e-3
    assert (k1 - k0).abs().max().item() > 0.05


def test_wrong_adapters_are_refused(adapters, tmp_path):
    base, _, folder, gguf = adapters["llama"]
    llama = load_model(base)
    hybrid = load_model(adapters["hybrid"][0])
    with pytest.raises(ValueError, match="architecture 'llama', the model is 'qwen35'"):
        read_adapter(gguf, hybrid)
    with pytest.raises(ValueError, match="no such file"):
        read_adapter(tmp_path / "nothing.gguf", llama)
    with pytest.raises(ValueError, match="not a LoRA adapter GGUF"):
        read_adapter(FIXTURE, llama)
    # a PEFT folder for other shapes: the hybrid's adapter names layers the llama has
    with pytest.raises(ValueError, match="another base model|not a linear layer"):
        read_adapter(adapters["hybrid"][2], llama)
    bad = make_lora(llama, tmp_path / "wide", targets=("q_proj",))
    w = load_file(bad / "adapter_model.safetensors")
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    save_file({**w, name: torch.zeros(w[name].shape[0] + 2, 4)},
              bad / "adapter_model.safetensors")
    with pytest.raises(ValueError, match=r"q_proj has A .* the model needs"):
        read_adapter(bad, llama)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="adapter_config.json"):
        read_adapter(tmp_path / "empty", llama)

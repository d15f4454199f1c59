"""The state space hybrids against transformers, on checkpoints transformers' own classes
wrote (make-tiny: tools/tiny_ssm.py): Nemotron-H, Granite-4.0-H, Falcon-H1, Mamba2 and
Jamba. Prompt logits in one step, greedy decoding one token a step, and a prompt fed
in uneven chunks (the state carried between steps) against the one-step logits."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from ckptd.model.configs import config_from_hf
from ckptd.model.testing import Scratch, prompt_logits
from tests.conftest import SSM_ARCHES
from tests.model.reference import check_greedy, check_prompt_logits

CLASSES = {"nemotron_h": "NemotronHForCausalLM", "granitemoehybrid":
           "GraniteMoeHybridForCausalLM", "falcon_h1": "FalconH1ForCausalLM",
           "mamba2": "Mamba2ForCausalLM", "jamba": "JambaForCausalLM"}


def _reference(folder, arch):
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(ref).__name__ == CLASSES[arch]
    return ref


@pytest.mark.parametrize("arch", SSM_ARCHES)
def test_logits_and_greedy_match_transformers(ssm_dirs, ssm_models, arch):
    ref, ours = _reference(ssm_dirs[arch], arch), ssm_models[arch]
    tokens = check_prompt_logits(ref, ours)
    check_greedy(ref, ours, tokens[:40])


@pytest.mark.parametrize("arch", SSM_ARCHES)
def test_chunked_prefill_and_batched_sequences_equal_one_step(ssm_models, arch):
    """Uneven chunks (the conv and SSM state carried across steps, chunks crossing the
    scan's 64-token chunks), two sequences packed in one step, and decodes mixed with a
    prefill: every logit equals the one-step prefill's."""
    model = ssm_models[arch]
    g = torch.Generator().manual_seed(2)
    a = torch.randint(3, 512, (150,), generator=g).tolist()
    b = torch.randint(3, 512, (90,), generator=g).tolist()
    want_a, want_b = prompt_logits(model, a), prompt_logits(model, b)
    s = Scratch(model, max_tokens=256, n_seqs=2)
    got_a, got_b, pos_a, pos_b = [], [], 0, 0
    for na, nb in ((1, 70), (63, 1), (2, 19), (84, 0), (0, 0)):
        chunks = {k: v for k, v in ((0, a[pos_a:pos_a + na]), (1, b[pos_b:pos_b + nb])) if v}
        if not chunks:
            break
        out = s.feed(chunks, all_logits=True)
        got_a.append(out[:len(chunks.get(0, []))])
        got_b.append(out[len(chunks.get(0, [])):])
        pos_a, pos_b = pos_a + na, pos_b + nb
    assert pos_a == len(a) and pos_b == len(b)
    assert (torch.cat(got_a) - want_a).abs().max().item() <= 1e-4
    assert (torch.cat(got_b) - want_b).abs().max().item() <= 1e-4


@pytest.mark.parametrize("arch", SSM_ARCHES)
def test_state_spec_declares_the_ssm_state(ssm_models, arch):
    """The cache sees a hybrid's two recurrent tensors, sized by the model: conv
    [n_rec, conv_dim, K-1] and the SSM state [n_rec, heads, head_dim, state_size]."""
    cfg = ssm_models[arch].config
    spec = ssm_models[arch].state_spec(16)
    assert spec.is_hybrid and spec.recurrent.n_layers == cfg.n_recurrent > 0
    assert spec.ssm_shape() == (cfg.n_recurrent, cfg.ssm_heads, cfg.ssm_head_dim,
                                cfg.ssm_state_size)
    assert spec.conv_shape() == (cfg.n_recurrent, cfg.ssm_conv_dim, cfg.ssm_conv_kernel - 1)
    assert (spec.attention is None) == (arch == "mamba2")


def test_lora_adapters_are_refused_with_the_architecture(ssm_models, tmp_path):
    from ckptd.model.lora.adapter import read_adapter
    with pytest.raises(ValueError, match="not supported on jamba models"):
        read_adapter(tmp_path, ssm_models["jamba"])


def test_bad_configs_are_refused_with_the_key(ssm_dirs):
    cfg = json.loads((ssm_dirs["nemotron_h"] / "config.json").read_text())
    with pytest.raises(ValueError, match="'E' is not supported"):
        config_from_hf({**cfg, "hybrid_override_pattern": "M*E-"})
    with pytest.raises(ValueError, match="missing 'hybrid_override_pattern'"):
        config_from_hf({k: v for k, v in cfg.items() if k != "hybrid_override_pattern"})
    granite = json.loads((ssm_dirs["granitemoehybrid"] / "config.json").read_text())
    with pytest.raises(ValueError, match="layer_types"):
        config_from_hf({**granite, "layer_types": ["mamba", "conv", "attention", "mamba"]})
    with pytest.raises(ValueError, match="SSM groups"):
        config_from_hf({**granite, "mamba_n_groups": 3})
    mamba = json.loads((ssm_dirs["mamba2"] / "config.json").read_text())
    with pytest.raises(ValueError, match="missing 'state_size'"):
        config_from_hf({k: v for k, v in mamba.items() if k != "state_size"})

"""Gemma 3's text model against transformers, on a checkpoint transformers' own
Gemma3ForCausalLM wrote (make-tiny --arch gemma3: six local layers of a 16-token window
around one global layer, soft-capped logits, the global rotary linearly scaled).
Prompts far longer than the window, greedy decoding one token a step, and a prompt fed
in uneven chunks against the one-step logits."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from ckptd.model.configs import config_from_hf
from ckptd.model.gemma_config import GemmaConfig
from ckptd.model.gguf.load import field, open_gguf
from ckptd.model.loader import load_model
from ckptd.model.testing import prompt_logits
from ckptd.tools.fetch_llamacpp import Conversion, convert
from tests.model.reference import check_chunks_equal_one_step, check_greedy, check_prompt_logits


@pytest.fixture(scope="module")
def gemma(hf_dirs, hf_models):
    return hf_dirs["gemma3"], hf_models["gemma3"]


def test_logits_and_greedy_match_transformers(gemma):
    folder, ours = gemma
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(ref).__name__ == "Gemma3ForCausalLM"
    cfg = ours.config
    assert isinstance(cfg, GemmaConfig) and cfg.sliding_window == 16
    assert cfg.layer_types.count("sliding_attention") == 6 and cfg.rope_factor == 2.0
    tokens = check_prompt_logits(ref, ours, lengths=(1, 17, 40, 300))
    check_greedy(ref, ours, tokens[:40])


def test_the_gguf_llamacpp_writes_gives_transformers_logits(gemma, llamacpp, tmp_path):
    """llama.cpp's converter adds 1 to every norm, keeps only the tokenizer's rows of
    the embedding and leaves the layer pattern and attention scale to llama.cpp's
    defaults: the GGUF's logits are transformers' over those rows, past the window."""
    folder, _ = gemma
    path = tmp_path / "gemma3.gguf"
    convert(llamacpp, [Conversion(folder, path, "f32")], tokenizer_pre="gpt-2")
    assert field(open_gguf(path), "general.architecture") == "gemma3"
    ours = load_model(path)
    V = ours.config.vocab_size
    assert 300 < V <= 512 and ours.config.layer_types == gemma[1].config.layer_types
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokens = torch.randint(3, V, (120,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        want = ref(input_ids=torch.tensor([tokens])).logits[0, :, :V]
    assert (prompt_logits(ours, tokens) - want).abs().max().item() <= 1e-4


def test_chunks_and_packed_sequences_equal_one_step(gemma):
    """Uneven chunks (crossing pages and windows), two sequences packed in one step and
    decodes beside a prefill: every logit equals the one-step prefill's."""
    check_chunks_equal_one_step(gemma[1])


def test_the_hubs_older_config_keys_are_read():
    """Released Gemma 3 configs name a pattern, rope_theta, rope_local_base_freq and
    rope_scaling where transformers 5 writes layer_types and rope_parameters."""
    cfg = config_from_hf({
        "model_type": "gemma3_text", "vocab_size": 512, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 8,
        "sliding_window_pattern": 2, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
        "query_pre_attn_scalar": 16})
    assert cfg.layer_types == ("sliding_attention", "full_attention")
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.rope_factor) == (1e6, 1e4, 4.0)
    assert cfg.window(0) == 8 and cfg.window(1) == 0
    assert cfg.state_spec(16).attention.n_layers == 2


@pytest.mark.parametrize(("key", "value", "says"), [
    ("attn_logit_softcapping", 50.0, "attn_logit_softcapping"),
    ("use_bidirectional_attention", True, "use_bidirectional_attention"),
    ("hidden_activation", "relu", "hidden_activation"),
    ("sliding_window", None, "sliding_window"),
    ("layer_types", ["sliding_attention", "chunked"], "layer_types"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 2.0}, "rope type"),
])
def test_unsupported_configs_are_refused_by_name(key, value, says):
    d = {"model_type": "gemma3_text", "vocab_size": 512, "hidden_size": 64,
         "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 8,
         "query_pre_attn_scalar": 16, key: value}
    with pytest.raises(ValueError, match=says):
        config_from_hf(d)

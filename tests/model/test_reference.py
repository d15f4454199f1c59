"""Our models against transformers on the same tiny random weights."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from ckptd.model.testing import prompt_logits


def test_logits_match_transformers(tiny_dir, tiny_model):
    ref = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    expected_class = ("Qwen3_5ForCausalLM" if tiny_model.config.arch == "qwen3_5_text"
                      else "LlamaForCausalLM")
    assert type(ref).__name__ == expected_class
    tokens = torch.randint(0, tiny_model.config.vocab_size, (200,),
                           generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        want = ref(torch.tensor([tokens])).logits[0]
    got = prompt_logits(tiny_model, tokens)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= 1e-4
    # not a degenerate model: greedy picks vary along the prompt
    assert len(set(want.argmax(-1).tolist())) > 20

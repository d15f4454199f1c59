"""Qwen3.5-MoE, its multimodal checkpoint and Qwen3-Next against transformers, on
checkpoints transformers' own classes wrote (tests/model/moe_models.py)."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from ckptd.model.loader import load_model
from tests.model.moe_models import KINDS, _class
from tests.model.reference import check_greedy, check_prompt_logits

CLASSES = {"moe": "Qwen3_5MoeForCausalLM", "moe-nested": "Qwen3_5MoeForConditionalGeneration",
           "next": "Qwen3NextForCausalLM", "next-dense": "Qwen3NextForCausalLM"}


def _reference(folder, kind):
    cls = _class(kind) if kind == "moe-nested" else AutoModelForCausalLM
    ref = cls.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(ref).__name__ == CLASSES[kind]
    return ref


@pytest.mark.parametrize("kind", KINDS)
def test_logits_and_greedy_match_transformers(moe_reference_dirs, kind):
    folder = moe_reference_dirs[kind]
    ref = _reference(folder, kind)
    ours = load_model(folder)
    assert "moe" in ours.config.mlp_types
    if kind == "next-dense":
        assert ours.config.mlp_types[1] == "dense" and not ours.config.norm_topk_prob
    tokens = check_prompt_logits(ref, ours)
    check_greedy(ref, ours, tokens[:40])


def test_routing_renormalises_where_the_config_says(moe_reference_dirs):
    x = torch.randn(17, 64, generator=torch.Generator().manual_seed(2))
    for kind, renorm in (("moe", True), ("next", True), ("next-dense", False)):
        moe = load_model(moe_reference_dirs[kind]).model.layers[0].mlp
        ids, weights = moe.route(x)
        assert ids.shape == (17, 2) and len(set(ids.reshape(-1).tolist())) > 2
        assert torch.allclose(weights.sum(-1), torch.ones(17)) == renorm, kind


def test_skipped_parts_are_logged_once(moe_reference_dirs, caplog):
    with caplog.at_level(logging.INFO, logger="ckptd.model"):
        load_model(moe_reference_dirs["moe-nested"])
        load_model(moe_reference_dirs["moe"])
    lines = [r.getMessage() for r in caplog.records if "skips" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "vision tower" in lines[0] and "multi-token-prediction" in lines[1]

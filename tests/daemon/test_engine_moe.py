"""The cache on a mixture-of-experts model: its StateSpec is the hybrid's (experts change
only the MLP), so every cache path must give the uncached tokens unchanged. A smaller
run of test_engine.py's properties on make-tiny's Qwen3.5-MoE."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tests.daemon import test_engine as base


def test_moe_state_spec_is_the_hybrids(tiny_moe_model, tiny_hybrid_dir):
    from ckptd.model.loader import load_model
    spec = tiny_moe_model.state_spec(8)
    assert spec.is_hybrid and spec.attention.n_layers == 1 and spec.recurrent.n_layers == 3
    assert spec == load_model(tiny_hybrid_dir).state_spec(8)    # same mixers, dense MLP
    assert tiny_moe_model.fingerprint != load_model(tiny_hybrid_dir).fingerprint


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(reqs=base.requests)
def test_moe_cached_equals_uncached_random_sharing(tiny_moe_dir, tiny_moe_model,
                                                   tmp_path_factory, reqs):
    base.random_sharing(tiny_moe_dir, tiny_moe_model, tmp_path_factory, reqs)


def test_moe_restored_logits_match_uncached(tiny_moe_dir, tiny_moe_model, tmp_path):
    base.test_restored_logits_match_uncached(tiny_moe_dir, tiny_moe_model, tmp_path)


def test_moe_exact_repeat_and_salts(tiny_moe_dir, tiny_moe_model, tmp_path):
    base.test_exact_repeat_computes_nothing_and_salts_isolate(tiny_moe_dir, tiny_moe_model,
                                                              tmp_path)


def test_moe_multi_turn_resumes_after_previous_answer(tiny_moe_dir, tiny_moe_model, tmp_path):
    base.test_multi_turn_resumes_after_previous_answer(tiny_moe_dir, tiny_moe_model, tmp_path)

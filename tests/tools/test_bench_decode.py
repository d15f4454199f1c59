"""tools/bench/decode.py: a context of random KV stands in for a prefill (the 64K rows of
docs/BENCHMARKS.md), and each row carries CPU time and the load beside the wall time."""

from __future__ import annotations

import pytest
import torch

from ckptd.model.loader import load
from ckptd.tools.bench import decode
from ckptd.tools.make_tiny import make_tiny


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return load(make_tiny("llama", tmp_path_factory.mktemp("tiny-llama"), seed=3),
                torch.float32)[0]


def test_random_kv_decodes_after_a_context_it_did_not_prefill(tiny_llama, monkeypatch):
    prefilled = []
    monkeypatch.setattr(decode.Runner, "step", _counting(decode.Runner.step, prefilled))
    row = decode.bench(tiny_llama, 2, 100, 3, graphs=False, random_kv=True)
    assert prefilled and max(prefilled) == 1       # only decode steps ran
    assert row["cpu_ms_per_step"] > 0 and row["tokens_per_s"] > 0
    assert {"threads", "load_1min"} <= row.keys()


def test_random_kv_is_refused_for_recurrent_layers(tmp_path):
    model = load(make_tiny("qwen3_5_text", tmp_path / "hybrid"), torch.float32)[0]
    with pytest.raises(ValueError, match="random-kv"):
        decode.bench(model, 1, 32, 1, graphs=False, random_kv=True)


def _counting(step, seen):
    def wrapped(self, work, *a, **k):
        seen.extend(n for _, n in work)
        return step(self, work, *a, **k)
    return wrapped

"""--gemv-activations q8 (model/kept_swap.py) with the cache, on the default model: the
engine over a real store answers a repeated prompt as an uncached run does, from the
device's pages and from disk after a restart, and the next turn of a conversation
(its answer's KV written by q8 decode steps) too; a cache written by the fp32 path is
never restored into a q8 model (the fingerprint names the mode)."""

from __future__ import annotations

import pytest

from ckptd.kernels.quant import cpu
from ckptd.model.default import default_model_path
from ckptd.model.loader import load
from tests.daemon.engines import Client
from tests.daemon.test_miss_reasons import _prompt, ask, make, uncached

B = 16
pytestmark = pytest.mark.skipif(not cpu.available(), reason="no C compiler for kernels/quant")


@pytest.fixture(scope="module")
def smol():
    return {mode: load(default_model_path(), gemv_activations=mode) for mode in ("fp32", "q8")}


def test_q8_cached_equals_uncached_across_a_restart(smol, tmp_path):
    q8 = smol["q8"]
    prompt = _prompt(90, 3)
    want = uncached(q8, prompt)
    for restart in (False, True):
        engine = make(q8, tmp_path)
        client = Client(engine)
        if not restart:                               # computed, then from the device
            firsts = [ask(client, prompt) for _ in range(2)]
            assert [got for got, _ in firsts] == [want, want]
            assert firsts[0][1]["restored"] == 0 < firsts[1][1]["restored"]
            turn = prompt + want + [40, 41, 42]       # the answer's KV: q8 decode steps
            got, report = ask(client, turn)
            assert got == uncached(q8, turn) and report["restored"] > len(prompt)
        else:                                         # from disk
            got, report = ask(client, prompt)
            assert got == want and report["restored"] >= 5 * B
        client.close()
        engine.cache.close()


def test_an_fp32_cache_never_restores_into_a_q8_model(smol, tmp_path):
    prompt = _prompt(80, 4)
    want = uncached(smol["q8"], prompt)
    first = make(smol["fp32"], tmp_path)
    client = Client(first)
    ask(client, prompt)
    client.close()
    first.cache.close()
    client = Client(make(smol["q8"], tmp_path))       # the same folder and weights
    got, report = ask(client, prompt)
    assert report["restored"] == 0 and report["miss"]["reason"] == "other_model"
    assert got == want
    client.close()

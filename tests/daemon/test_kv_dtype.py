"""--kv-dtype float16 (model/loader.py: use_kv_dtype): the attention KV kept in fp16 on
the CPU. Cached answers equal uncached ones in fp16 too (the engine over a real store,
across a restart), and a cache written by the same weights with fp32 KV is never
restored into an fp16 pool (the fingerprint names the KV dtype)."""

from __future__ import annotations

import pytest
import torch

from ckptd.daemon.config import ServeConfig
from ckptd.kernels.paged_attention import cpu as attn_cpu
from ckptd.model.loader import load_model, use_kv_dtype
from ckptd.model.text.tokenizer import Tokenizer
from tests.daemon.daemon_proc import start
from tests.daemon.engines import Client
from tests.daemon.test_miss_reasons import _prompt, ask, make, uncached
from tests.daemon.test_sleep import _complete, _wait_asleep

B = 16


@pytest.fixture(scope="module")
def kv(tiny_llama_dir):
    """The tiny llama twice, as (model, tokenizer): with fp32 KV and with fp16 KV."""
    tok = Tokenizer.from_dir(tiny_llama_dir)
    fp16 = load_model(tiny_llama_dir)
    use_kv_dtype(fp16, torch.float16)
    return {"fp32": (load_model(tiny_llama_dir), tok), "fp16": (fp16, tok)}


def test_the_spec_and_fingerprint_carry_the_kv_dtype(kv):
    a, b = kv["fp32"][0], kv["fp16"][0]
    assert a.state_spec(B).kv_dtype == torch.float32
    assert b.state_spec(B).kv_dtype == torch.float16
    assert b.state_spec(B).page_bytes() * 2 == a.state_spec(B).page_bytes()
    assert a.fingerprint != b.fingerprint
    assert b.state_spec(B).recurrent == a.state_spec(B).recurrent     # only the KV


def test_only_fp16_kv_for_an_fp32_cpu_model(tiny_llama_dir, kv):
    fp32 = kv["fp32"]
    use_kv_dtype(fp32[0], torch.float32)            # the compute dtype: nothing changes
    use_kv_dtype(fp32[0], None)
    assert fp32[0].kv_dtype is None
    model = load_model(tiny_llama_dir)
    with pytest.raises(ValueError, match="only float16 KV with a float32 model"):
        use_kv_dtype(model, torch.bfloat16)
    with pytest.raises(ValueError, match="kv_dtype must be one of auto, float16, float32"):
        ServeConfig(kv_dtype="f16")


@pytest.mark.skipif(not attn_cpu.reads(torch.float16), reason="no F16C here")
def test_fp16_cached_equals_uncached_across_a_restart(kv, tmp_path):
    fp16 = kv["fp16"]
    prompt = _prompt(90, 3)
    want = uncached(fp16, prompt)
    first = make(fp16, tmp_path)
    client = Client(first)
    got, report = ask(client, prompt)
    assert got == want and report["restored"] == 0
    got, report = ask(client, prompt)                 # from the device's pages
    assert got == want and report["restored"] > 0
    client.close()
    first.cache.close()
    client = Client(make(fp16, tmp_path))             # a restart: from disk
    got, report = ask(client, prompt)
    assert got == want and report["restored"] >= 5 * B
    assert client.engine.runner.state.kv.dtype == torch.float16


def test_an_fp32_cache_never_restores_into_an_fp16_pool(kv, tmp_path):
    fp32, fp16 = kv["fp32"], kv["fp16"]
    prompt = _prompt(80, 4)
    want = uncached(fp16, prompt)
    first = make(fp32, tmp_path)
    client = Client(first)
    ask(client, prompt)
    client.close()
    first.cache.close()
    client = Client(make(fp16, tmp_path))             # the same folder and weights
    got, report = ask(client, prompt)
    assert report["restored"] == 0 and report["miss"]["reason"] == "other_model"
    assert got == want


@pytest.mark.skipif(not attn_cpu.reads(torch.float16), reason="no F16C here")
def test_the_flag_serves_fp16_kv_and_wakes_into_the_same_cache(tiny_llama_dir, tmp_path):
    """A real daemon on loopback: --kv-dtype float16 answers as the engine does, sleeps,
    and wakes with the same fingerprint (its cache restores)."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 6
    d = start(tiny_llama_dir, tmp_path / "cache", "--max-context", "256", "--parallel", "1",
              "--kv-dtype", "float16", "--sleep-idle-seconds", "1")
    try:
        first = _complete(d, prompt)
        assert first["timings"]["cache_n"] == 0
        _wait_asleep(d)
        again = _complete(d, prompt)
        assert again["content"] == first["content"] and again["timings"]["cache_n"] > 0
    finally:
        assert d.stop() == 0, d.output()

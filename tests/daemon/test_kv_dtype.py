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
from tests.daemon.engines import Client
from tests.daemon.engines import make_engine as _make

B = 16


@pytest.fixture(scope="module")
def fp32(tiny_llama_dir):
    return load_model(tiny_llama_dir), Tokenizer.from_dir(tiny_llama_dir)


@pytest.fixture(scope="module")
def fp16(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    use_kv_dtype(model, torch.float16)
    return model, Tokenizer.from_dir(tiny_llama_dir)


def make(pair, path):
    model, tok = pair
    return _make(model, tok, path, block_size=B, step_tokens=64)


def ask(client: Client, prompt: list[int], use_cache: bool = True):
    """(tokens, timings.cache) of one request; its checkpoints on disk after it."""
    res = client.submit(prompt, use_cache=use_cache).wait()
    if use_cache:
        client.engine.cache.store.flush()
    return res.tokens, res.fin.stats.timings()["cache"]


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 400, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_the_spec_and_fingerprint_carry_the_kv_dtype(fp32, fp16):
    a, b = fp32[0], fp16[0]
    assert a.state_spec(B).kv_dtype == torch.float32
    assert b.state_spec(B).kv_dtype == torch.float16
    assert b.state_spec(B).page_bytes() * 2 == a.state_spec(B).page_bytes()
    assert a.fingerprint != b.fingerprint
    assert b.state_spec(B).recurrent == a.state_spec(B).recurrent     # only the KV


def test_only_fp16_kv_for_an_fp32_cpu_model(tiny_llama_dir, fp32):
    use_kv_dtype(fp32[0], torch.float32)            # the compute dtype: nothing changes
    use_kv_dtype(fp32[0], None)
    assert fp32[0].kv_dtype is None
    model = load_model(tiny_llama_dir)
    with pytest.raises(ValueError, match="only float16 KV with a float32 model"):
        use_kv_dtype(model, torch.bfloat16)
    with pytest.raises(ValueError, match="kv_dtype must be one of auto, float16, float32"):
        ServeConfig(kv_dtype="f16")


@pytest.mark.skipif(not attn_cpu.reads(torch.float16), reason="no F16C here")
def test_fp16_cached_equals_uncached_across_a_restart(fp16, tmp_path):
    prompt = _prompt(90, 3)
    uncached = Client(make(fp16, None))
    want, _ = ask(uncached, prompt, use_cache=False)
    uncached.close()
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


def test_an_fp32_cache_never_restores_into_an_fp16_pool(fp32, fp16, tmp_path):
    prompt = _prompt(80, 4)
    uncached = Client(make(fp16, None))
    want, _ = ask(uncached, prompt, use_cache=False)
    uncached.close()
    first = make(fp32, tmp_path)
    client = Client(first)
    ask(client, prompt)
    client.close()
    first.cache.close()
    client = Client(make(fp16, tmp_path))             # the same folder and weights
    got, report = ask(client, prompt)
    assert report["restored"] == 0 and report["miss"]["reason"] == "other_model"
    assert got == want

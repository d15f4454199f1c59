"""A CPU decode step's fused layers (model/arch/decode_cpu.py) give the torch path's
logits: several sequences on scattered pages, step after step (SmolLM2's greedy tokens
either way: tests/model/test_smollm2.py)."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels.norm import cpu as norm_cpu
from ckptd.kernels.paged_attention import cpu as attn_cpu
from ckptd.model.arch import decode_cpu
from ckptd.model.batch import SeqChunk, StepBatch
from ckptd.model.loader import load_model, use_kv_dtype
from ckptd.model.state import DeviceState

needs_cc = pytest.mark.skipif(not (attn_cpu.available() and norm_cpu.available()),
                              reason="no C compiler here")
B = 16


class Scattered:
    """A few sequences whose pages are shuffled over the pool, fed step by step; `fused`
    False runs every layer through the torch path."""

    def __init__(self, model, n_seqs: int, max_tokens: int, seed: int, fused: bool) -> None:
        self.model, self.fused, self.calls = model, fused, 0
        per = -(-max_tokens // B)
        self.state = DeviceState(model.state_spec(B), per * n_seqs + 2, n_seqs, model.device)
        order = torch.randperm(per * n_seqs + 2, generator=torch.Generator().manual_seed(seed))
        self.pages = [order[i * per:(i + 1) * per].to(torch.int32) for i in range(n_seqs)]
        self.lengths = [0] * n_seqs

    def feed(self, chunks: dict[int, list[int]], monkeypatch) -> torch.Tensor:
        ids, seqs, last = [], [], []
        for seq, toks in chunks.items():
            ctx, start = self.lengths[seq], len(ids)
            ids += toks
            table = self.pages[seq][:-(-(ctx + len(toks)) // B)]
            seqs.append(SeqChunk(start, len(toks), ctx, table, seq))
            last.append(len(ids) - 1)
            self.lengths[seq] += len(toks)
        batch = StepBatch.build(seqs, ids, last, B, self.state.device)
        layer = decode_cpu.decoder_layer

        def counted(*a):
            self.calls += 1
            return layer(*a)

        with monkeypatch.context() as m:
            m.setattr(decode_cpu, "decoder_layer", counted)
            if not self.fused:
                m.setattr(decode_cpu.DecodeStep, "build", classmethod(lambda *a: None))
            return self.model(batch, self.state)


@pytest.fixture(scope="module")
def tiny_llama(tiny_llama_dir):
    return load_model(tiny_llama_dir)


@pytest.fixture(scope="module")
def tiny_llama_f16(tiny_llama_dir):
    """The same model keeping its KV in fp16 (--kv-dtype float16)."""
    model = load_model(tiny_llama_dir)
    use_kv_dtype(model, torch.float16)
    return model


@needs_cc
@pytest.mark.parametrize("kv", ["tiny_llama", "tiny_llama_f16"])
def test_fused_decode_equals_the_torch_path(kv, request, monkeypatch):
    tiny_llama = request.getfixturevalue(kv)
    if not attn_cpu.reads(tiny_llama.state_spec(B).kv_dtype):
        pytest.skip("this CPU has no F16C")
    # fp16 KV: the fused path's fp32 k differs from torch's by an ulp at most (the norm's
    # sum of squares adds in another order), which now and then lands on the other side
    # of an fp16 rounding point: one fp16 ulp in a key, ~1e-5 in the logits
    tol = 1e-5 if kv == "tiny_llama" else 5e-5
    g = torch.Generator().manual_seed(3)
    prompts = {i: torch.randint(3, 500, (n,), generator=g).tolist()
               for i, n in enumerate([1, 21, 47])}
    runs = [Scattered(tiny_llama, 3, 80, seed=5, fused=f) for f in (True, False)]
    for r in runs:
        r.feed(prompts, monkeypatch)                     # prefill: the torch path both
    assert runs[0].calls == 0
    for step in range(6):
        toks = torch.randint(3, 500, (3,), generator=g).tolist()
        chunks = {i: [t] for i, t in enumerate(toks)} if step != 3 else {2: [toks[2]],
                                                                          0: [toks[0]]}
        fused, plain = (r.feed(chunks, monkeypatch) for r in runs)
        assert (fused - plain).abs().max().item() <= tol
    assert runs[0].calls == 6 * len(tiny_llama.model.layers) and runs[1].calls == 0
    kv0, kv1 = (r.state.kv.float() for r in runs)
    assert runs[0].state.kv.dtype == tiny_llama.state_spec(B).kv_dtype
    if kv == "tiny_llama":
        assert (kv0 - kv1).abs().max() <= 1e-5                    # the same KV
    else:      # the same KV but where an fp32 ulp apart crossed an fp16 rounding point
        assert torch.allclose(kv0, kv1, rtol=2 ** -10, atol=1e-7)


@needs_cc
def test_a_gated_attention_model_keeps_the_torch_path(tiny_hybrid_dir, monkeypatch):
    model = load_model(tiny_hybrid_dir)
    run = Scattered(model, 1, 40, seed=1, fused=True)
    run.feed({0: [5, 6, 7]}, monkeypatch)
    run.feed({0: [8]}, monkeypatch)
    assert run.calls == 0

"""The C decode attention (kernels/paged_attention/cpu.c) over a head-major pool equals
the plain reference and torch's fused path, and its absence falls back to torch."""

from __future__ import annotations

import logging

import pytest
import torch

from ckptd.kernels.paged_attention import cpu, layout, naive, sdpa

needs_cc = pytest.mark.skipif(not cpu.available(), reason="no C compiler here")


def _pool(lens: list[int], Hkv: int, D: int, B: int, g: torch.Generator,
          dtype: torch.dtype = torch.float32):
    """A head-major pool (as the engine makes on the CPU) holding each sequence's K/V
    in scattered pages, and the sequences' page tables [N, width]."""
    counts = [-(-n // B) for n in lens]
    P = sum(counts) + 5
    pool = layout.new_pool(P, (2, 2, B, Hkv, D), dtype, torch.device("cpu"), True)
    assert layout.head_major(pool) is not None
    order = torch.randperm(P, generator=g).to(torch.int32)
    tables = torch.zeros(len(lens), max(counts), dtype=torch.int32)
    used = 0
    for i, (n, c) in enumerate(zip(lens, counts)):
        tables[i, :c] = order[used:used + c]
        used += c
        k, v = torch.randn(n, Hkv, D, generator=g), torch.randn(n, Hkv, D, generator=g)
        kv_index = tables[i].long()[torch.arange(n) // B] * B + torch.arange(n) % B
        naive.write_kv(pool, 1, kv_index, k, v)
    return pool, tables


@needs_cc
@pytest.mark.parametrize("lens, Hq, Hkv, D, B", [
    ([1, 17, 130], 6, 3, 20, 16),           # a page, a partial page, many pages
    ([3000], 9, 3, 64, 16),                  # SmolLM2's heads: the pages split over items
    ([700, 5], 8, 2, 32, 256),               # the largest page cpu.c takes
    ([257], 4, 4, 16, 32),                   # no GQA
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_equals_reference_and_torch(lens, Hq, Hkv, D, B, dtype, monkeypatch):
    """fp16 KV (--kv-dtype float16): the kernel reads the pool's fp16 values as the
    reference does, converted to fp32, so the answers agree as closely as in fp32."""
    if not cpu.reads(dtype):
        pytest.skip("this CPU has no F16C")
    g = torch.Generator().manual_seed(sum(lens) + D)
    pool, tables = _pool(lens, Hkv, D, B, g, dtype)
    assert cpu.supports(layout.head_major(pool), torch.zeros(1), B)
    q = torch.randn(len(lens), Hq, D, generator=g)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    want = naive.paged_decode_attention(q, pool, 1, tables, seq_lens, D ** -0.5)
    got = sdpa.paged_decode_attention(q, pool, 1, tables, seq_lens, D ** -0.5)
    monkeypatch.setattr(cpu.library, "lib", None)        # torch's fused kernel instead
    fused = sdpa.paged_decode_attention(q, pool, 1, tables, seq_lens, D ** -0.5)
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() <= 2e-5
    assert (got - fused).abs().max() <= 2e-5


@needs_cc
def test_log_sum_exp_is_the_scaled_scores():
    g = torch.Generator().manual_seed(3)
    Hq, Hkv, D, B, n = 6, 2, 32, 16, 900
    pool, tables = _pool([n], Hkv, D, B, g)
    memory = layout.head_major(pool)
    q = torch.randn(Hq, 1, D, generator=g)
    out, lse = cpu.attend(q, memory, 1, tables[0], n, D ** -0.5, B)
    kv_index = tables[0].long()[torch.arange(n) // B] * B + torch.arange(n) % B
    k = memory[1, 0][:, kv_index].repeat_interleave(Hq // Hkv, 0)    # [Hq, n, D]
    scores = (q @ k.transpose(1, 2)) * D ** -0.5
    assert (lse - scores.logsumexp(-1)).abs().max() <= 1e-4
    assert out.shape == (Hq, 1, D)


@needs_cc
def test_a_short_page_table_is_refused():
    pool, tables = _pool([40], 2, 16, 16, torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="page table"):
        cpu.attend(torch.randn(2, 1, 16), layout.head_major(pool), 1, tables[0, :2], 40,
                   0.25, 16)


def test_without_a_compiler_attention_falls_back_to_torch(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("CKPTD_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setattr(cpu.library, "lib", None)
    monkeypatch.setattr(cpu.library, "tried", False)
    with caplog.at_level(logging.WARNING, logger="ckptd.kernels"):
        assert not cpu.available()
    assert "cannot build" in caplog.text and "torch's fused kernel instead" in caplog.text
    g = torch.Generator().manual_seed(5)
    pool, tables = _pool([50], 2, 16, 16, g)
    q = torch.randn(1, 4, 16, generator=g)
    seq_lens = torch.tensor([50], dtype=torch.int32)
    want = naive.paged_decode_attention(q, pool, 1, tables, seq_lens, 0.25)
    got = sdpa.paged_decode_attention(q, pool, 1, tables, seq_lens, 0.25)
    assert (got - want).abs().max() <= 1e-5

"""Kept-weight kernels against the plain-torch reference (dequantize, then matmul): the
compiled CPU kernels (decode rows block by block, longer steps through a reused
buffer) and the Triton kernels, interpreted on the CPU (fp32, small shapes)."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels import dispatch
from ckptd.kernels.quant import cpu, naive, triton_quant
from tests.kernels.quant_data import ALL_FORMATS, kept

needs_cc = pytest.mark.skipif(not cpu.available(), reason="no C compiler for kernels/quant/cpu.c")


def _close(got, want):
    scale = want.abs().max().clamp_min(1e-6)
    assert (got - want).abs().max() / scale < 2e-6


@needs_cc
@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_cpu_dequantize_is_exact(fmt):
    qt = kept(fmt, 37, 512, seed=3)
    assert torch.equal(cpu.dequantize_rows(qt, 0, 37), qt.dequantize())
    assert torch.equal(cpu.dequantize_rows(qt, 5, 9), qt.dequantize()[5:9])


@needs_cc
@pytest.mark.parametrize("fmt", ALL_FORMATS)
@pytest.mark.parametrize("rows", [1, 3, cpu.GEMV_ROWS + 1, 40])    # decode .. buffered
def test_cpu_matmul_matches_reference(fmt, rows):
    qt = kept(fmt, 70, 768, seed=4)
    x = torch.randn(rows, 768, generator=torch.Generator().manual_seed(rows))
    bias = torch.randn(70)
    _close(cpu.matmul(x, qt, bias), naive.matmul(x, qt, bias))


@needs_cc
def test_cpu_matmul_chunks_rows_past_its_buffer(monkeypatch):
    monkeypatch.setattr(cpu, "_CHUNK_BYTES", 4 * 256 * 10)     # 10 rows a chunk
    qt = kept("Q4_K", 33, 256, seed=5)
    x = torch.randn(cpu.GEMV_ROWS + 3, 256)
    _close(cpu.matmul(x, qt), naive.matmul(x, qt))


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_triton_matmul_matches_reference(fmt, triton_env):
    # 12 rows: past the decode GEMV's 8 (test_quant_gemv.py), the tiled GEMM
    qt = kept(fmt, 40, 512, seed=6)
    x = torch.randn(12, 512)
    bias = torch.randn(40)
    _close(dispatch.quant_matmul(x, qt, bias), naive.matmul(x, qt, bias))


@pytest.mark.parametrize("tokens", [1, 7])
def test_triton_moe_matches_grouped_reference(tokens, triton_env):
    E, inter, H, k = 5, 256, 256, 2
    gate, up = kept("Q4_K", inter, H, (E,), seed=7), kept("Q8_0", inter, H, (E,), seed=8)
    down = kept("Q6_K", H, inter, (E,), seed=9)
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, H, generator=g)
    ids = torch.rand(tokens, E, generator=g).topk(k, dim=-1).indices
    w = torch.rand(tokens, k, generator=g)
    want = naive.moe_experts(x, ids, w, gate, up, down)
    # the grouped GEMM itself (the dispatch takes the decode GEMV for few tokens)
    _close(triton_quant.moe_experts(x, ids, w, gate, up, down), want)


def test_grouped_reference_matches_expanded_experts():
    """The kept grouped path computes kernels/moe's sum over the dequantized experts."""
    from ckptd.kernels.moe import naive as moe_naive

    E, inter, H = 4, 64, 96
    gate, up = (kept("Q8_0", inter, H, (E,), seed=s) for s in (1, 2))
    down = kept("Q4_1", H, inter, (E,), seed=3)
    x = torch.randn(6, H)
    ids = torch.randint(0, E, (6, 2))
    w = torch.rand(6, 2)
    gate_up = torch.cat([gate.dequantize(), up.dequantize()], dim=1)
    want = moe_naive.moe_per_token(x, ids, w, gate_up, down.dequantize())
    _close(naive.moe_experts(x, ids, w, gate, up, down), want)
    _close(dispatch.quant_moe_experts(x, ids, w, gate, up, down), want)

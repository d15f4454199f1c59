"""A decode step's fused CPU calls (kernels/paged_attention/cpu.c's ckpa_decode_step,
kernels/norm/cpu.c) equal the torch ops they replace: rotary, the KV write and the
attention of several sequences on scattered pages in one call; RMSNorm with its
residual add; SwiGLU."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels.norm import cpu as norm_cpu
from ckptd.kernels.norm import naive as norm_ref
from ckptd.kernels.paged_attention import cpu, layout, naive
from ckptd.kernels.rotary import naive as rotary
from ckptd.kernels.swiglu import naive as swiglu

needs_cc = pytest.mark.skipif(not (cpu.available() and norm_cpu.available()),
                              reason="no C compiler here")


def _scattered(lens: list[int], Hkv: int, D: int, B: int, g: torch.Generator,
               dtype: torch.dtype = torch.float32):
    """A head-major pool with each sequence's first lens[i] - 1 tokens of random K/V in
    shuffled pages, and the page tables [N, width] covering lens[i] tokens."""
    counts = [-(-n // B) for n in lens]
    P = sum(counts) + 3
    pool = layout.new_pool(P, (3, 2, B, Hkv, D), dtype, torch.device("cpu"), True)
    pool.copy_(torch.randn(pool.shape, generator=g))      # garbage where nothing is written
    order = torch.randperm(P, generator=g).to(torch.int32)
    tables = torch.zeros(len(lens), max(counts), dtype=torch.int32)
    used = 0
    for i, c in enumerate(counts):
        tables[i, :c] = order[used:used + c]
        used += c
    return pool, tables


@needs_cc
@pytest.mark.parametrize("lens, Hq, Hkv, D, R, B", [
    ([1, 18, 131, 40], 6, 3, 20, 20, 16),    # a first token, partial pages, several seqs
    ([2000], 9, 3, 64, 64, 16),              # SmolLM2's heads: pages split into runs
    ([33, 700], 8, 2, 32, 16, 32),           # partial rotary: the last 16 dims pass
    ([257, 3], 4, 4, 16, 16, 256),           # no GQA; the largest page cpu.c takes
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_step_equals_rotary_write_and_attention(lens, Hq, Hkv, D, R, B, dtype):
    """fp16 KV: k rotated in fp32 and rounded to nearest even, as torch's .to() rounds
    it, so the pools stay equal bit for bit."""
    if not cpu.reads(dtype):
        pytest.skip("this CPU has no F16C")
    g = torch.Generator().manual_seed(sum(lens) + D)
    pool, tables = _scattered(lens, Hkv, D, B, g, dtype)
    want_pool = pool.clone()
    N = len(lens)
    qkv = torch.randn(N, (Hq + 2 * Hkv) * D, generator=g)
    positions = torch.tensor([n - 1 for n in lens])
    cos, sin = rotary.rotary_cos_sin(positions, R, 10000.0)
    kv_index = tables.long()[torch.arange(N), positions // B] * B + positions % B
    scale = D ** -0.5

    q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
    q = rotary.apply_rotary(q.reshape(N, Hq, D), cos, sin)
    k = rotary.apply_rotary(k.reshape(N, Hkv, D), cos, sin)
    naive.write_kv(want_pool, 2, kv_index, k, v.reshape(N, Hkv, D))
    want = naive.paged_decode_attention(q, want_pool, 2, tables,
                                        torch.tensor(lens, dtype=torch.int32), scale)

    splits = cpu.decode_splits(N, max(lens), Hkv, B, torch.get_num_threads())
    got = cpu.decode_step(qkv, layout.head_major(pool), 2, cos, sin, kv_index, tables,
                          torch.tensor(lens, dtype=torch.int32), (Hq, Hkv), scale, B, splits)
    assert torch.equal(pool, want_pool)          # the same rotated k, the same rows
    assert (got.view(N, Hq, D) - want).abs().max() <= 1e-5


@needs_cc
def test_decode_step_splits_do_not_change_the_answer():
    """More runs of pages than a sequence has, or one: the same output."""
    g = torch.Generator().manual_seed(7)
    lens, Hq, Hkv, D, B = [90, 5], 4, 2, 16, 16
    pool, tables = _scattered(lens, Hkv, D, B, g)
    qkv = torch.randn(2, (Hq + 2 * Hkv) * D, generator=g)
    cos, sin = rotary.rotary_cos_sin(torch.tensor([89, 4]), D, 10000.0)
    kv_index = tables.long()[torch.arange(2), torch.tensor([89, 4]) // B] * B \
        + torch.tensor([89, 4]) % B
    outs = [cpu.decode_step(qkv, layout.head_major(pool), 1, cos, sin, kv_index, tables,
                            torch.tensor(lens, dtype=torch.int32), (Hq, Hkv), 0.25, B, s)
            for s in (1, 3, 40)]
    assert (outs[0] - outs[1]).abs().max() <= 1e-6
    assert (outs[0] - outs[2]).abs().max() <= 1e-6


@needs_cc
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_row_ops_equal_torch(offset):
    g = torch.Generator().manual_seed(int(offset) + 1)
    x, delta = torch.randn(3, 576, generator=g) * 3, torch.randn(3, 576, generator=g)
    w = torch.randn(576, generator=g)
    assert (norm_cpu.rms_norm(x, w, 1e-5, offset)
            - norm_ref.rms_norm(x, w, 1e-5, offset)).abs().max() <= 1e-5
    want_x = x + delta
    want = norm_ref.rms_norm(want_x, w, 1e-6, offset)
    got = norm_cpu.add_rms_norm(x, delta, w, 1e-6, offset)
    assert torch.equal(x, want_x)                 # the residual added in place
    assert (got - want).abs().max() <= 1e-5
    gu = torch.randn(2, 2 * 100, generator=g) * 4
    gate, up = gu.chunk(2, dim=-1)
    assert (norm_cpu.silu_and_mul(gu) - swiglu.silu_and_mul(gate, up)).abs().max() <= 1e-5


@needs_cc
def test_row_ops_refuse_what_they_cannot_read():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="contiguous fp32"):
        norm_cpu.rms_norm(x.t(), torch.ones(2), 1e-6)
    with pytest.raises(ValueError, match="norm weight"):
        norm_cpu.rms_norm(x, torch.ones(7), 1e-6)
    with pytest.raises(ValueError, match="delta"):
        norm_cpu.add_rms_norm(x, torch.randn(2, 4), torch.ones(8), 1e-6)

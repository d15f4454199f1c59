"""The MoE expert kernels: the grouped reference against the per-token definition, and
the Triton grouped GEMM against the reference (interpreted on the CPU)."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels import dispatch
from ckptd.kernels.moe import naive
from ckptd.kernels.moe.triton_moe import align as _align

# (tokens, experts, top-k, hidden, intermediate): a decode step, an odd batch, a prefill
# chunk with more rows than a block, and dims that are not powers of two
SHAPES = [(1, 8, 2, 64, 32), pytest.param((13, 8, 2, 64, 32), marks=pytest.mark.grid),
          (70, 6, 3, 40, 24)]


def _inputs(N, E, k, H, inter, seed=0, device="cpu", dtype=torch.float32, skip=()):
    """Random routing; the experts in `skip` get no token."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([e for e in range(E) if e not in skip])
    scores = torch.rand(N, len(allowed), generator=g)
    ids = allowed[scores.topk(k, dim=-1).indices]
    w = torch.rand(N, k, generator=g)
    w = w / w.sum(-1, keepdim=True)
    x = torch.randn(N, H, generator=g)
    w13 = torch.randn(E, 2 * inter, H, generator=g) / H ** 0.5
    w2 = torch.randn(E, H, inter, generator=g) / inter ** 0.5
    return [t.to(device, dtype) if t.is_floating_point() else t.to(device)
            for t in (x, ids, w, w13, w2)]


@pytest.mark.parametrize("grouped_mm", [True, False], ids=["grouped_mm", "loop"])
@pytest.mark.parametrize("shape", SHAPES)
def test_grouped_reference_matches_per_token_definition(shape, grouped_mm, monkeypatch):
    # torch's grouped_mm where it has one (the CPU), a loop over the active experts else
    monkeypatch.setattr(naive, "_GROUPED_MM", grouped_mm and naive._GROUPED_MM)
    x, ids, w, w13, w2 = _inputs(*shape)
    got = naive.moe_experts(x, ids, w, w13, w2)
    want = naive.moe_per_token(x, ids, w, w13, w2)
    assert (got - want).abs().max().item() <= 1e-5


def test_grouped_reference_in_bf16():
    x, ids, w, w13, w2 = _inputs(33, 8, 2, 64, 32, dtype=torch.bfloat16)
    got = naive.moe_experts(x, ids, w, w13, w2)
    want = naive.moe_per_token(*(t.float() if t.is_floating_point() else t
                                 for t in (x, ids, w, w13, w2)))
    assert got.dtype == torch.bfloat16 and (got.float() - want).abs().max().item() <= 0.05


@pytest.mark.parametrize("grouped_mm", [True, False], ids=["grouped_mm", "loop"])
def test_grouped_reference_reads_only_routed_experts(grouped_mm, monkeypatch):
    monkeypatch.setattr(naive, "_GROUPED_MM", grouped_mm and naive._GROUPED_MM)
    x, ids, w, w13, w2 = _inputs(9, 8, 2, 64, 32, skip=(1, 4, 6))
    w13[[1, 4, 6]] = float("nan")       # a read of an unrouted expert poisons the output
    w2[[1, 4, 6]] = float("nan")
    out = naive.moe_experts(x, ids, w, w13, w2)
    assert torch.isfinite(out).all()


def test_align_blocks_hold_one_expert_each():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3], [3, 2], [5, 3]])
    pair_ids, block_expert = _align(ids, 8, 4)
    n_pairs = ids.numel()
    flat = ids.reshape(-1)
    seen = []
    for b, e in enumerate(block_expert.tolist()):
        rows = [r for r in pair_ids[b * 4:(b + 1) * 4].tolist() if r < n_pairs]
        if e < 0:
            assert rows == []
            continue
        assert rows and all(flat[r] == e for r in rows)
        seen += rows
    assert sorted(seen) == list(range(n_pairs))              # every pair exactly once
    # experts 4, 6, 7 got no token: no block
    assert not {4, 6, 7} & set(block_expert.tolist())


@pytest.mark.usefixtures("triton_env")
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_matches_reference(shape, device, close):
    x, ids, w, w13, w2 = _inputs(*shape, device=device)
    want = naive.moe_experts(x, ids, w, w13, w2)
    got = dispatch.moe_experts(x, ids, w, w13, w2)
    assert got.shape == want.shape and close(got, want, 1e-5)


@pytest.mark.usefixtures("triton_env")
def test_triton_with_idle_experts_and_small_blocks(device, close):
    # 5 of 12 experts idle; blocks of 16 rows make several blocks per busy expert
    x, ids, w, w13, w2 = _inputs(40, 12, 2, 48, 40, seed=3, device=device,
                                 skip=(0, 2, 5, 9, 11))
    from ckptd.kernels.moe.triton_moe import moe_experts
    want = naive.moe_experts(x, ids, w, w13, w2)
    assert close(moe_experts(x, ids, w, w13, w2, block_m=16), want, 1e-5)


@pytest.mark.usefixtures("triton_env")
def test_triton_empty_batch(device):
    x, ids, w, w13, w2 = _inputs(3, 4, 2, 32, 16, device=device)
    out = dispatch.moe_experts(x[:0], ids[:0], w[:0], w13, w2)
    assert out.shape == (0, 32)


def test_bad_shapes_raise():
    x, ids, w, w13, w2 = _inputs(4, 4, 2, 32, 16)
    with pytest.raises(ValueError, match="w_gate_up"):
        naive.moe_experts(x[:, :16], ids, w, w13, w2)
    with pytest.raises(ValueError, match="topk_w"):
        naive.moe_experts(x, ids, w[:, :1], w13, w2)


def test_triton_modules_import_under_the_installed_name():
    # dispatch once imported `kernels.<op>`, which only the repo root's sys.path resolves
    assert dispatch._fast("swiglu.triton_swiglu").__name__ == "ckptd.kernels.swiglu.triton_swiglu"


@pytest.mark.usefixtures("triton_env")
@pytest.mark.parametrize("block_m", [None, 16])
def test_triton_clamped_experts_with_biases_match_reference(block_m, device, close):
    """gpt-oss' experts: biases on both projections and the clamped SwiGLU, with inputs
    large enough that gate passes the limit and up leaves [-limit, limit]; idle experts."""
    x, ids, w, w13, w2 = _inputs(40, 8, 2, 48, 24, seed=4, device=device, skip=(2, 5))
    x = x * 6
    g = torch.Generator().manual_seed(4)
    b13 = torch.randn(8, 48, generator=g).to(device)
    b2 = torch.randn(8, 48, generator=g).to(device)
    h = x @ w13[ids[0, 0]].T
    assert (h[:, :24] > 7).any() and (h[:, 24:].abs() > 7).any()
    want = naive.moe_experts_clamped(x, ids, w, w13, b13, w2, b2, 1.702, 7.0)
    from ckptd.kernels.moe.triton_moe import moe_experts, moe_experts_clamped
    got = moe_experts(x, ids, w, w13, w2, block_m=block_m, biases=(b13, b2),
                      clamp=(1.702, 7.0))
    assert close(got, want, 1e-5)
    assert close(dispatch.moe_experts_clamped(x, ids, w, w13, b13, w2, b2, 1.702, 7.0), want,
                 1e-5)
    assert close(moe_experts_clamped(x, ids, w, w13, b13, w2, b2, 1.702, 7.0), want, 1e-5)
    assert not close(got, naive.moe_experts(x, ids, w, w13, w2), 1e-5)

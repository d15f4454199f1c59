"""The decode GEMV over kept weights (kernels/quant/gemv.py) against the plain reference
(kernels/quant/naive.py), interpreted on the CPU: every block format, 1..8 rows, odd N
and an odd number of blocks of K, with K split (partial sums and a second pass) and not;
the kept experts of a decode step per (token, expert) pair; bf16 for the types."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels import dispatch, launch
from ckptd.kernels.quant import gemv, naive
from tests.kernels.quant_data import BLOCK_FORMATS, kept

pytestmark = pytest.mark.usefixtures("triton_env")


def _close(got, want):
    scale = want.abs().max().clamp_min(1e-6)
    assert (got - want).abs().max() / scale < 2e-6


def _splits(monkeypatch, n: int) -> list[int]:
    """Force n K splits (as many as the steps allow); returns the splits launched."""
    launched: list[int] = []

    def split(t, blocks, steps):
        launched.append(min(n, steps))
        return n
    monkeypatch.setattr(launch, "quant_gemv_split", split)
    return launched


def _cols(fmt: str, blocks: int) -> int:
    """K of an odd number of the format's blocks (past one 256-value step)."""
    return blocks * (256 if fmt.endswith("_K") else 32)


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
@pytest.mark.parametrize("rows,split", [(1, 1), (5, 3)])
def test_gemv_matches_reference(fmt, rows, split, monkeypatch):
    launched = _splits(monkeypatch, split)
    K = _cols(fmt, 3 if fmt.endswith("_K") else 23)         # 736: the last step is partial
    qt = kept(fmt, 37, K, seed=rows)
    g = torch.Generator().manual_seed(split)
    x, bias = torch.randn(rows, K, generator=g), torch.randn(37, generator=g)
    _close(dispatch.quant_matmul(x, qt, bias), naive.matmul(x, qt, bias))
    _close(dispatch.quant_matmul(x, qt), naive.matmul(x, qt))
    assert launched == [split] * 2          # the dispatch took the GEMV, split as forced


@pytest.mark.parametrize("rows", [2, 3, 4, 6, 7, 8])
def test_gemv_takes_every_row_count(rows, monkeypatch):
    _splits(monkeypatch, 2)
    qt = kept("Q4_K", 19, 512, seed=rows)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    _close(gemv.matmul(x, qt), naive.matmul(x, qt))


def test_default_split_fills_the_device():
    t = launch.Target(90, 132)
    # N = 4096 in rows of 16: 256 programs, split in three; N = 512: 32 programs, capped
    # by K's steps (each split at least four)
    assert launch.quant_gemv_split(t, 256, 16) == 3
    assert launch.quant_gemv_split(t, 32, 8) == 2
    assert launch.quant_gemv_split(t, 32, 64) == 16
    assert launch.quant_gemv_split(t, 1024, 64) == 1


def test_rows_past_the_gemv_and_unblocked_formats_take_the_tiled_gemm():
    x = torch.zeros(9, 256)
    assert not gemv.takes(x, kept("Q4_K", 4, 256))
    assert gemv.takes(x[:8], kept("Q4_K", 4, 256))
    assert not gemv.takes(x[:1], kept("F16", 4, 256))
    with pytest.raises(ValueError, match="1..8 rows"):
        gemv.matmul(x, kept("Q4_K", 4, 256))


def _experts(fmts: tuple[str, str, str], E: int, inter: int, H: int):
    gate, up = kept(fmts[0], inter, H, (E,), seed=1), kept(fmts[1], inter, H, (E,), seed=2)
    return gate, up, kept(fmts[2], H, inter, (E,), seed=3)


@pytest.mark.parametrize("tokens,fmts,inter,H", [
    (1, ("Q4_K", "Q4_K", "Q6_K"), 256, 256),       # the Q4_K_M mix's experts
    (3, ("Q8_0", "Q4_1", "Q4_0"), 32, 96),         # gate and up in different formats
    (2, ("Q5_K", "Q5_K", "Q8_0"), 96, 256),      # down over 3 blocks of K
])
def test_moe_gemv_matches_reference(tokens, fmts, inter, H):
    E, k = 5, 2
    gate, up, down = _experts(fmts, E, inter, H)
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, H, generator=g)
    ids = torch.rand(tokens, E, generator=g).topk(k, dim=-1).indices
    w = torch.rand(tokens, k, generator=g)
    assert gemv.takes_experts(x, gate, up, down)
    got = dispatch.quant_moe_experts(x, ids, w, gate, up, down)
    _close(got, naive.moe_experts(x, ids, w, gate, up, down))


def test_moe_gemv_reads_only_the_chosen_experts():
    # NaN in every expert no token chose: a read of one would show in the sums
    E, inter, H = 4, 32, 64
    gate, up, down = _experts(("Q8_0", "Q8_0", "Q8_0"), E, inter, H)
    for t in (gate, up, down):
        t.data[1:3].view(-1, 34)[:, :2] = torch.tensor([0x00, 0x7E], dtype=torch.uint8)
    x, ids, w = torch.randn(2, H), torch.tensor([[0, 3], [3, 0]]), torch.rand(2, 2)
    got = dispatch.quant_moe_experts(x, ids, w, gate, up, down)
    assert torch.isfinite(got).all()
    _close(got, naive.moe_experts(x, ids, w, gate, up, down))


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_gemv_runs_on_bf16(fmt, monkeypatch):
    # bf16 values are wrong in the interpreter; its type checks are the compiler's
    _splits(monkeypatch, 2)
    qt = kept(fmt, 16, 512, seed=2)
    x = torch.randn(3, 512).to(torch.bfloat16)
    bias = torch.randn(16).to(torch.bfloat16)
    assert dispatch.quant_matmul(x, qt, bias).dtype == torch.bfloat16
    _splits(monkeypatch, 1)
    assert dispatch.quant_matmul(x, qt, bias).dtype == torch.bfloat16


@pytest.mark.parametrize("fmts,inter,H", [(("Q4_K", "Q5_K", "Q6_K"), 256, 256),
                                          (("Q4_0", "Q4_1", "Q8_0"), 32, 64)])
def test_moe_gemv_runs_on_bf16(fmts, inter, H):
    gate, up, down = _experts(fmts, 2, inter, H)
    x = torch.randn(1, H).to(torch.bfloat16)
    out = dispatch.quant_moe_experts(x, torch.tensor([[1]]), torch.rand(1, 1), gate, up, down)
    assert out.dtype == torch.bfloat16 and out.shape == (1, H)

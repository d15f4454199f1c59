"""Mamba (v1)'s selective scan: the plain-torch form against transformers' (Jamba), and
the Triton scan against it."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels import dispatch
from ckptd.kernels.mamba1 import naive, triton_scan
from ckptd.kernels.mamba1 import reference_varlen as ref_varlen

pytestmark = pytest.mark.usefixtures("triton_env")


def _inputs(T, D=40, N=12, seed=0, device="cpu", dtype=torch.float32):
    """x, dt, A, B, C, Dskip, h0 as Jamba's mixer makes them (dt > 0, A < 0)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g)
    dt = torch.nn.functional.softplus(torch.randn(T, D, generator=g) - 1)
    A = -torch.exp(torch.rand(D, N, generator=g) * 2 - 1)
    B = torch.randn(T, N, generator=g)
    C = torch.randn(T, N, generator=g)
    Dskip = torch.randn(D, generator=g)
    h0 = torch.randn(D, N, generator=g)
    return [t.to(device, dtype if i in (0, 3, 4) else torch.float32)
            for i, t in enumerate((x, dt, A, B, C, Dskip, h0))]


@pytest.mark.parametrize("T", [1, 17, 300])
def test_naive_equals_transformers(T, close):
    from transformers.models.jamba.modeling_jamba import mamba_selective_scan
    x, dt, A, B, C, Dskip, _ = _inputs(T)
    y, h = naive.selective_scan(x, dt, A, B, C, Dskip)     # transformers starts from zeros
    hf_y, hf_h = mamba_selective_scan(x.t()[None], dt.t()[None], A, B.t()[None], C.t()[None],
                                      D=Dskip, return_last_state=True)
    assert close(y, hf_y[0].t()) and close(h, hf_h[0])


@pytest.mark.parametrize("T", [1, 45])
def test_single_sequence_equals_reference(T, device, close):
    x, dt, A, B, C, Dskip, h0 = _inputs(T, device=device)
    want_y, want_h = naive.selective_scan(x, dt, A, B, C, Dskip, h0)
    y, h = triton_scan.selective_scan(x, dt, A, B, C, Dskip, h0)
    assert y.dtype == x.dtype and h.dtype == torch.float32
    assert close(y, want_y) and close(h, want_h)
    y, h = triton_scan.selective_scan(x, dt, A, B, C)           # no skip, zero state
    want_y, want_h = naive.selective_scan(x, dt, A, B, C)
    assert close(y, want_y) and close(h, want_h)


def test_two_chunks_carrying_state_equal_one_shot(device, close):
    x, dt, A, B, C, Dskip, h0 = _inputs(30, seed=3, device=device)
    y, h = triton_scan.selective_scan(x, dt, A, B, C, Dskip, h0)
    ya, ha = triton_scan.selective_scan(x[:13], dt[:13], A, B[:13], C[:13], Dskip, h0)
    yb, hb = triton_scan.selective_scan(x[13:], dt[13:], A, B[13:], C[13:], Dskip, ha)
    assert close(torch.cat([ya, yb]), y) and close(hb, h)


def test_prefill_then_decode_equals_token_by_token(device, close):
    x, dt, A, B, C, Dskip, h0 = _inputs(30, seed=6, device=device)
    pool = h0[None].clone()
    ys = [dispatch.selective_scan_varlen(x[:25], dt[:25], A, B[:25], C[:25], Dskip, [0, 25],
                                         pool, [0])]
    for t in range(25, 30):
        ys.append(dispatch.selective_scan_varlen(x[t:t + 1], dt[t:t + 1], A, B[t:t + 1],
                                                 C[t:t + 1], Dskip, [0, 1], pool, [0]))
    want_y, want_h = naive.selective_scan(x, dt, A, B, C, Dskip, h0)
    assert close(torch.cat(ys), want_y) and close(pool[0], want_h)


def _packed(lengths, seed=4, device="cpu"):
    x, dt, A, B, C, Dskip, _ = _inputs(sum(lengths), seed=seed, device=device)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    pool = torch.randn(6, x.shape[1], A.shape[1],
                       generator=torch.Generator().manual_seed(seed)).to(device)
    return x, dt, A, B, C, Dskip, cu, pool


def test_varlen_sequences_update_their_cells(device, close):
    lengths, cells = [23, 1, 30, 7], [4, 0, 2, 5]
    x, dt, A, B, C, Dskip, cu, pool = _packed(lengths, device=device)
    want_pool = pool.clone()
    want = ref_varlen.selective_scan_varlen(x, dt, A, B, C, Dskip, cu, want_pool, cells)
    got = dispatch.selective_scan_varlen(x, dt, A, B, C, Dskip, cu, pool,
                                         torch.tensor(cells, device=device))
    assert close(got, want) and close(pool, want_pool)
    assert torch.equal(pool[[1, 3]], want_pool[[1, 3]])     # untouched cells stay as they were


def test_decode_batch_and_strided_pool_of_one_layer(device, close):
    """One token of each of 5 sequences, their states in ssm[:, layer, 0] (the model's
    pool: [cells, n_rec, 1, D, N])."""
    x, dt, A, B, C, Dskip, _, _ = _packed([1] * 5, device=device)
    ssm = torch.randn(6, 2, 1, 40, 12, generator=torch.Generator().manual_seed(1)).to(device)
    cells = [3, 0, 5, 1, 2]
    want = ssm.clone()
    cu = list(range(6))
    ref_y = ref_varlen.selective_scan_varlen(x, dt, A, B, C, Dskip, cu, want[:, 1, 0], cells)
    y = dispatch.selective_scan_varlen(x, dt, A, B, C, Dskip, cu, ssm[:, 1, 0], cells)
    assert close(y, ref_y) and close(ssm, want)
    assert torch.equal(ssm[4], want[4]) and torch.equal(ssm[:, 0], want[:, 0])


def test_gpu_launch_shape_on_this_device(device, close, monkeypatch):
    """Blocks of channels as a GPU launches them (scan_launch at cc 90)."""
    real = triton_scan.scan_launch
    monkeypatch.setattr(triton_scan, "scan_launch", lambda cc, D, N, dt: real(90, D, N, dt))
    assert real(90, 300, 12, torch.float32)["BD"] < 300    # several blocks of channels
    x, dt, A, B, C, Dskip, _ = _inputs(13, D=300, device=device)
    cu = [0, 9, 13]
    pool = torch.randn(4, 300, 12, generator=torch.Generator().manual_seed(2)).to(device)
    want_pool = pool.clone()
    want = ref_varlen.selective_scan_varlen(x, dt, A, B, C, Dskip, cu, want_pool, [1, 3])
    got = triton_scan.selective_scan_varlen(x, dt, A, B, C, Dskip, cu, pool, [1, 3])
    assert close(got, want) and close(pool, want_pool)


def test_16_bit_inputs_compile_their_types(device):
    for dtype in (torch.bfloat16, torch.float16):
        x, dt, A, B, C, Dskip, h0 = _inputs(5, device=device, dtype=dtype)
        y, h = triton_scan.selective_scan(x, dt, A, B, C, Dskip, h0)
        assert y.dtype == dtype and h.dtype == torch.float32


def test_bad_inputs_raise_value_error(device):
    x, dt, A, B, C, Dskip, h0 = _inputs(8, device=device)
    with pytest.raises(ValueError, match="initial_state"):
        triton_scan.selective_scan(x, dt, A, B, C, Dskip, h0[:, :5])
    with pytest.raises(ValueError, match="dt"):
        naive.selective_scan(x, dt[:, :2], A, B, C)
    with pytest.raises(ValueError, match="D \\["):
        triton_scan.selective_scan(x, dt, A, B, C, Dskip[:3])
    pool = torch.zeros(2, 40, 12, dtype=torch.float64, device=device)
    with pytest.raises(ValueError, match="float32"):
        dispatch.selective_scan_varlen(x, dt, A, B, C, Dskip, [0, 8], pool, [0])
    with pytest.raises(ValueError, match="cu_seqlens"):
        dispatch.selective_scan_varlen(x, dt, A, B, C, Dskip, [0, 5], pool.float(), [0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 is wrong in the interpreter")
def test_bf16_on_gpu(close):
    x, dt, A, B, C, Dskip, h0 = _inputs(1500, D=1024, N=16, device="cuda", dtype=torch.bfloat16)
    want_y, want_h = naive.selective_scan(x.float(), dt, A, B.float(), C.float(), Dskip, h0)
    y, h = triton_scan.selective_scan(x, dt, A, B, C, Dskip, h0)
    assert y.dtype == torch.bfloat16
    assert close(y, want_y, 2e-2) and close(h, want_h, 2e-2)

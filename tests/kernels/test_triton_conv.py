"""Triton causal conv1d (prefill, varlen, decode) against the plain-torch conv."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels import dispatch
from ckptd.kernels.conv1d import naive
from ckptd.kernels.conv1d import reference_varlen as ref_varlen

pytestmark = pytest.mark.usefixtures("triton_env")


def _inputs(T, C=40, K=4, seed=0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, C, generator=g)
    w = torch.randn(C, K, generator=g)
    b = torch.randn(C, generator=g)
    s0 = torch.randn(C, K - 1, generator=g)
    return [t.to(device, dtype) for t in (x, w, b, s0)]


@pytest.mark.parametrize("T", [1, pytest.param(2, marks=pytest.mark.grid),
                               pytest.param(63, marks=pytest.mark.grid), 500])
@pytest.mark.parametrize("activation", ["silu", None])
def test_prefill_equals_reference(T, activation, device, close):
    x, w, b, s0 = _inputs(T, device=device)
    want_y, want_s = naive.causal_conv1d(x, w, b, s0, activation)
    y, s = dispatch.causal_conv1d(x, w, b, s0, activation)
    assert close(y, want_y) and torch.equal(s, want_s)
    want_y, want_s = naive.causal_conv1d(x, w, None, None, activation)
    y, s = dispatch.causal_conv1d(x, w, None, None, activation)
    assert close(y, want_y) and torch.equal(s, want_s)


@pytest.mark.parametrize("K", [2, 4, 5])
def test_kernel_widths_and_odd_channels(K, device, close):
    x, w, b, s0 = _inputs(37, C=130, K=K, seed=1, device=device)
    want_y, want_s = naive.causal_conv1d(x, w, b, s0)
    y, s = dispatch.causal_conv1d(x, w, b, s0)
    assert close(y, want_y) and torch.equal(s, want_s)


def test_two_chunks_carrying_state_equal_one_shot(device, close):
    x, w, b, s0 = _inputs(150, seed=2, device=device)
    y, s = dispatch.causal_conv1d(x, w, b, s0)
    for cut in (1, 2, 64, 70):
        ya, sa = dispatch.causal_conv1d(x[:cut], w, b, s0)
        yb, sb = dispatch.causal_conv1d(x[cut:], w, b, sa)
        assert close(torch.cat([ya, yb]), y) and torch.equal(sb, s)


def test_decode_steps_equal_prefill(device, close):
    x, w, b, s0 = _inputs(20, seed=3, device=device)
    y, s = dispatch.causal_conv1d(x, w, b, s0)
    state, steps = s0[None], []
    for t in range(x.shape[0]):
        out, new = dispatch.causal_conv1d_update(x[t:t + 1], state, w, b)
        assert torch.equal(new, naive.causal_conv1d_update(x[t:t + 1], state, w, b)[1])
        steps.append(out)
        state = new
    assert close(torch.cat(steps), y) and torch.equal(state[0], s)


def test_varlen_sequences_update_their_cells(device, close):
    lengths, cells = [63, 1, 2, 100, 17], [4, 0, 2, 5, 6]
    x, w, b, _ = _inputs(sum(lengths), seed=4, device=device)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    pool = torch.randn(8, 40, 3, generator=torch.Generator().manual_seed(4)).to(device)
    want_pool = pool.clone()
    want = ref_varlen.causal_conv1d_varlen(x, w, b, cu, want_pool, cells)
    got = dispatch.causal_conv1d_varlen(x, w, b, torch.tensor(cu), pool, cells)
    assert close(got, want) and torch.equal(pool, want_pool)


def test_decode_cells_in_place_on_a_strided_layer_pool(device, close):
    # the model's pool is conv[:, layer]: cells strided over all layers, contiguous inside
    x, w, b, _ = _inputs(3, seed=5, device=device)
    conv = torch.randn(5, 2, 40, 3, generator=torch.Generator().manual_seed(5)).to(device)
    want = conv.clone()
    want_y = ref_varlen.causal_conv1d_update_cells(x, want[:, 1], [3, 0, 4], w, b)
    y = dispatch.causal_conv1d_update_cells(x, conv[:, 1], torch.tensor([3, 0, 4]), w, b)
    assert close(y, want_y) and torch.equal(conv, want)


def test_half_precision(device, close):
    x, w, b, s0 = _inputs(70, seed=6, device=device, dtype=torch.float16)
    want_y, want_s = naive.causal_conv1d(x, w, b, s0)
    y, s = dispatch.causal_conv1d(x, w, b, s0)
    assert y.dtype == torch.float16 and close(y, want_y, 2e-3) and torch.equal(s, want_s)


def test_bad_inputs_raise_value_error(device):
    x, w, b, s0 = _inputs(8, device=device)
    with pytest.raises(ValueError, match="initial_state"):
        dispatch.causal_conv1d(x, w, b, s0[:, :2])
    with pytest.raises(ValueError, match="activation"):
        dispatch.causal_conv1d(x, w, b, s0, "gelu")
    with pytest.raises(ValueError, match="bias"):
        dispatch.causal_conv1d(x, w, b[:3], s0)
    with pytest.raises(ValueError, match="state index"):
        dispatch.causal_conv1d_update_cells(x, torch.zeros(2, 40, 3, device=device), [0], w)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 is wrong in the interpreter")
def test_bf16_on_gpu(close):
    x, w, b, s0 = _inputs(3000, C=4096, seed=7, device="cuda", dtype=torch.bfloat16)
    want_y, want_s = naive.causal_conv1d(x, w, b, s0)
    y, s = dispatch.causal_conv1d(x, w, b, s0)
    assert close(y, want_y, 1e-2) and torch.equal(s, want_s)

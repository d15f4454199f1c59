"""Triton norms, rotary and SwiGLU against the references."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels import dispatch
from ckptd.kernels.gated_delta.naive import l2norm
from ckptd.kernels.norm import naive as norm_ref
from ckptd.kernels.rotary import naive as rotary_ref
from ckptd.kernels.swiglu import naive as swiglu_ref

pytestmark = pytest.mark.usefixtures("triton_env")

# the interpreter's grid of shapes; on a GPU (tools/gpu_check.sh: -m "not grid") the last
SHAPES = [pytest.param((1, 24), marks=pytest.mark.grid),
          pytest.param((63, 40), marks=pytest.mark.grid), (500, 3, 24)]
DTYPES = [(torch.float32, 2e-6), (torch.float16, 2e-3)]


def _rand(*shape, seed=0, device="cpu", dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device, dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
def test_norms(shape, dtype, tol, device, close):
    x = _rand(*shape, device=device, dtype=dtype)
    z = _rand(*shape, seed=1, device=device, dtype=dtype)
    w = _rand(shape[-1], seed=2, device=device, dtype=dtype)
    for offset in (0.0, 1.0):
        want = norm_ref.rms_norm(x, w, 1e-6, offset)
        got = dispatch.rms_norm(x, w, 1e-6, offset)
        assert got.dtype == want.dtype and close(got, want, tol)
    want = norm_ref.gated_rms_norm(x, z, w, 1e-6)
    got = dispatch.gated_rms_norm(x, z, w, 1e-6)
    assert got.dtype == want.dtype and close(got, want, tol)
    got = dispatch.l2norm(x)
    assert got.dtype == torch.float32 and close(got, l2norm(x), 2e-6)


def test_rms_norm_keeps_the_reference_dtype_promotion(device, close):
    x = _rand(5, 24, device=device, dtype=torch.float16)
    w = _rand(24, seed=1, device=device)
    want = norm_ref.rms_norm(x, w, 1e-5)
    got = dispatch.rms_norm(x, w, 1e-5)
    assert got.dtype == want.dtype == torch.float32 and close(got, want, 2e-6)


@pytest.mark.parametrize(("T", "H", "D", "R"), [(1, 2, 24, 24), (63, 3, 40, 10), (500, 2, 16, 4)])
@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
def test_rotary(T, H, D, R, dtype, tol, device, close):
    x = _rand(T, H, D, device=device, dtype=dtype)
    cos, sin = rotary_ref.rotary_cos_sin(torch.arange(T, device=device) + 7, R, 10000.0)
    want = rotary_ref.apply_rotary(x, cos, sin)
    got = dispatch.apply_rotary(x, cos, sin)
    assert got.dtype == dtype and close(got, want, tol)
    view = _rand(T, H, 2 * D, device=device, dtype=dtype)[..., D:]    # strided, as q from a
    assert close(dispatch.apply_rotary(view, cos, sin),                # fused projection
                 rotary_ref.apply_rotary(view, cos, sin), tol)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
def test_silu_and_mul(shape, dtype, tol, device, close):
    gate = _rand(*shape, device=device, dtype=dtype)
    up = _rand(*shape, seed=1, device=device, dtype=dtype)
    got = dispatch.silu_and_mul(gate, up)
    assert got.dtype == dtype and close(got, swiglu_ref.silu_and_mul(gate, up), tol)


def test_bad_inputs_raise_value_error(device):
    x = _rand(4, 24, device=device)
    with pytest.raises(ValueError, match="weight"):
        dispatch.rms_norm(x, x[0, :10], 1e-6)
    with pytest.raises(ValueError, match="rotary dim"):
        dispatch.apply_rotary(x[:, None], x[:, :3], x[:, :3])
    with pytest.raises(ValueError, match="one shape"):
        dispatch.silu_and_mul(x, x[:2])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 is wrong in the interpreter")
def test_bf16_on_gpu(close):
    x = _rand(4096, 2048, device="cuda", dtype=torch.bfloat16)
    z = _rand(4096, 2048, seed=1, device="cuda", dtype=torch.bfloat16)
    w = _rand(2048, seed=2, device="cuda", dtype=torch.bfloat16)
    assert close(dispatch.rms_norm(x, w, 1e-6, 1.0), norm_ref.rms_norm(x, w, 1e-6, 1.0), 1e-2)
    assert close(dispatch.gated_rms_norm(x, z, w, 1e-6),
                 norm_ref.gated_rms_norm(x, z, w, 1e-6), 1e-2)
    assert close(dispatch.silu_and_mul(x, z), swiglu_ref.silu_and_mul(x, z), 1e-2)
    q = x.view(4096, 16, 128)
    cos, sin = rotary_ref.rotary_cos_sin(torch.arange(4096, device="cuda"), 32, 1e7)
    assert close(dispatch.apply_rotary(q, cos, sin), rotary_ref.apply_rotary(q, cos, sin), 1e-2)

"""The optional kernels of `pip install ckptd[gpu]` against the references, where
installed (on CUDA): fla's chunked gated delta rule, flash-attn's paged attention."""

from __future__ import annotations

from importlib.util import find_spec

import pytest
import torch

from ckptd.kernels import dispatch
from ckptd.kernels.gated_delta import reference_varlen as gdn_ref
from ckptd.kernels.paged_attention import reference_varlen as attn_ref
from tests.kernels.test_step_kernels import _gdn, _varlen
from tests.kernels.test_triton_attention import _filled

CUDA = torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not (CUDA and find_spec("fla")), reason="needs CUDA and fla-core")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fla_chunk_varlen_equals_reference(dtype, close):
    from ckptd.kernels.external import fla

    q_lens, slots = [700, 1, 64, 129], [3, 0, 2, 1]
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    q, k, v, g, beta = _gdn(cu[-1], 8, 128, 128, 5, "cuda", dtype)
    pool = torch.randn(4, 8, 128, 128, device="cuda") * 0.1
    want_pool = pool.clone()
    want = gdn_ref.chunk_gated_delta_rule_varlen(q, k, v, g, beta, cu, want_pool, slots)
    got = fla.chunk_gated_delta_rule_varlen(q, k, v, g, beta, cu, pool,
                                            torch.tensor(slots, device="cuda"))
    tol = 3e-2 if dtype == torch.bfloat16 else 2e-3
    assert got.dtype == v.dtype and pool.dtype == torch.float32
    assert close(got, want, tol) and close(pool, want_pool, tol)


@pytest.mark.gpu
@pytest.mark.skipif(not (CUDA and find_spec("flash_attn")), reason="needs CUDA and flash-attn")
def test_flash_attn_step_equals_reference(close):
    from ckptd.kernels.external import flash

    ctx, q_lens = [0, 300, 1000], [700, 1, 64]
    pool, tables = _filled([c + n for c, n in zip(ctx, q_lens)], B=256, Hkv=2, D=128,
                           device="cuda", dtype=torch.bfloat16)
    assert flash.usable(pool)
    v = _varlen(ctx, q_lens, tables, [0, 1, 2], "cuda", B=256)
    q = torch.randn(sum(q_lens), 16, 128, device="cuda", dtype=torch.bfloat16)
    want = attn_ref.paged_attention_varlen(q, pool, 1, list(v.cu), ctx, tables, 128 ** -0.5)
    assert close(flash.step_attention(q, pool, 1, v, 128 ** -0.5), want, 2e-2)
    assert close(dispatch.step_attention(q, pool, 1, v, 128 ** -0.5), want, 2e-2)


def test_external_kernels_are_off_on_the_cpu_and_when_turned_off(monkeypatch):
    x = torch.zeros(2, device="cpu")
    assert not dispatch.use_external("fla", x) and not dispatch.use_external("flash", x)
    monkeypatch.setattr(dispatch, "EXTERNAL", False)
    if CUDA:
        assert not dispatch.use_external("fla", x.cuda())

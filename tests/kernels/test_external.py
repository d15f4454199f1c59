"""The optional kernels of `pip install ckptd[gpu]` against the references, where
installed (on CUDA): fla's chunked gated delta rule, flash-attn's paged attention."""

from __future__ import annotations

from importlib.util import find_spec

import pytest
import torch

from ckptd.kernels import dispatch, external
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

    q_lens, cells = [700, 1, 64, 129], [3, 0, 2, 1]
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    q, k, v, g, beta = _gdn(cu[-1], 8, 128, 128, 5, "cuda", dtype)
    pool = torch.randn(4, 8, 128, 128, device="cuda") * 0.1
    want_pool = pool.clone()
    want = gdn_ref.chunk_gated_delta_rule_varlen(q, k, v, g, beta, cu, want_pool, cells)
    got = fla.chunk_gated_delta_rule_varlen(q, k, v, g, beta, cu, pool,
                                            torch.tensor(cells, device="cuda"))
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


@pytest.mark.usefixtures("triton_env")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fla_takes_half_precision_prefill_and_fp32_keeps_ckptd_kernel(dtype, monkeypatch):
    # fla multiplies fp32 inputs in TF32 (~4e-4 off at K = 128, where ckptd's fp32 kernel
    # is exact): an fp32 step must not reach it. Its bf16 call's dtypes: the gate's
    # test_fla_through_the_adapter_compiles compiles it for sm_80..90.
    from ckptd.kernels.external import fla

    taken = []
    monkeypatch.setattr(dispatch, "use_external", lambda name, x: name == "fla")
    monkeypatch.setattr(fla, "chunk_gated_delta_rule_varlen",
                        lambda q, k, v, *rest: taken.append(v.dtype) or v)
    q_lens, cells = [20, 1], [1, 0]
    v = _varlen([0, 3], q_lens, torch.zeros(2, 8, dtype=torch.int32), cells, "cpu")
    q, k, vv, g, beta = _gdn(sum(q_lens), 2, 16, 16, 3, "cpu", dtype)
    pool = torch.zeros(2, 2, 16, 16)
    want_pool = pool.clone()
    out = dispatch.step_gated_delta(q, k, vv, g, beta, pool, v)
    assert taken == ([] if dtype == torch.float32 else [dtype])
    if dtype == torch.float32:
        want = gdn_ref.chunk_gated_delta_rule_varlen(q, k, vv, g, beta, list(v.cu),
                                                     want_pool, cells)
        assert torch.allclose(out, want, atol=1e-5) and torch.allclose(pool, want_pool,
                                                                       atol=1e-5)


def test_an_external_kernel_that_does_not_import_leaves_ours(monkeypatch, caplog):
    # installed but built for another Triton or CUDA: one warning, ckptd's kernels run
    monkeypatch.setattr(external, "_IMPORTS", {})
    monkeypatch.setitem(external.MODULES, "fla", "ckptd_not_a_module.ops")
    monkeypatch.setitem(external.MODULES, "flash", "json")
    assert external.imports("fla") is False and external.imports("fla") is False
    assert external.imports("flash") is True
    warned = [r.getMessage() for r in caplog.records if "does not import" in r.getMessage()]
    assert len(warned) == 1 and "fla" in warned[0] and "ModuleNotFoundError" in warned[0]

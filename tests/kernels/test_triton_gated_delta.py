"""Triton gated delta rule (chunked and step-by-step) against the plain-torch rule."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels import dispatch
from ckptd.kernels.gated_delta import naive
from ckptd.kernels.gated_delta import reference_varlen as ref_varlen

pytestmark = pytest.mark.usefixtures("triton_env")


def _inputs(T, H=3, K=24, V=40, seed=0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = naive.l2norm(torch.randn(T, H, K, generator=g))
    k = naive.l2norm(torch.randn(T, H, K, generator=g))
    v = torch.randn(T, H, V, generator=g)
    decay = -torch.rand(T, H, generator=g)
    beta = torch.rand(T, H, generator=g)
    s0 = torch.randn(H, K, V, generator=g)
    return [x.to(device, dtype if i < 3 else torch.float32)
            for i, x in enumerate((q, k, v, decay, beta, s0))]


# the step-by-step kernel walks a sequence's tokens one program per head: shorter there
@pytest.mark.parametrize(("rule", "T"), [
    ("chunk", 1), pytest.param("chunk", 63, marks=pytest.mark.grid), ("chunk", 500),
    ("recurrent", 1), ("recurrent", 63)])
def test_single_sequence_equals_reference(T, rule, device, close):
    q, k, v, g, beta, s0 = _inputs(T, device=device)
    # the chunked reference: equal to the step-by-step one (tests/kernels/test_naive.py), faster
    want_o, want_s = naive.chunk_gated_delta_rule(q, k, v, g, beta, s0)
    fn = dispatch.chunk_gated_delta_rule if rule == "chunk" else \
        dispatch.recurrent_gated_delta_rule
    o, s = fn(q, k, v, g, beta, s0)
    assert o.dtype == v.dtype and s.dtype == torch.float32
    assert close(o, want_o) and close(s, want_s)


@pytest.mark.parametrize("rule", ["chunk", "recurrent"])
def test_no_initial_state_means_zeros(rule, device, close):
    q, k, v, g, beta, _ = _inputs(40, seed=5, device=device)
    want_o, want_s = naive.recurrent_gated_delta_rule(q, k, v, g, beta)
    fn = dispatch.chunk_gated_delta_rule if rule == "chunk" else \
        dispatch.recurrent_gated_delta_rule
    o, s = fn(q, k, v, g, beta)
    assert close(o, want_o) and close(s, want_s)


@pytest.mark.parametrize("chunk_size", [pytest.param(16, marks=pytest.mark.grid), 32])
def test_chunk_sizes(chunk_size, device, close):
    q, k, v, g, beta, s0 = _inputs(100, H=2, K=40, V=24, seed=1, device=device)
    want_o, want_s = naive.chunk_gated_delta_rule(q, k, v, g, beta, s0)
    o, s = dispatch.chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=chunk_size)
    assert close(o, want_o) and close(s, want_s)


def test_nearly_parallel_keys_stay_accurate(device, close):
    # (I + A) is worst conditioned when a chunk's keys nearly coincide, beta ~ 1, g ~ 0
    q, k, v, g, beta, _ = _inputs(128, seed=2, device=device)
    base = torch.randn(1, 3, 24, generator=torch.Generator().manual_seed(9)).to(device)
    k = naive.l2norm(base + 0.01 * k)
    g, beta = 0.01 * g, 0.5 + 0.5 * beta
    want_o, want_s = naive.recurrent_gated_delta_rule(q, k, v, g, beta)
    o, s = dispatch.chunk_gated_delta_rule(q, k, v, g, beta)
    assert close(o, want_o, 1e-4) and close(s, want_s, 1e-4)


@pytest.mark.parametrize("rule", ["chunk", "recurrent"])
def test_two_chunks_carrying_state_equal_one_shot(rule, device, close):
    # the chunked rule's cuts on and off its 64-token chunks; the step-by-step one's anywhere
    T, cuts = (100, (64, 70)) if rule == "chunk" else (30, (1, 17))
    q, k, v, g, beta, s0 = _inputs(T, seed=3, device=device)
    fn = dispatch.chunk_gated_delta_rule if rule == "chunk" else \
        dispatch.recurrent_gated_delta_rule
    o, s = fn(q, k, v, g, beta, s0)
    for cut in cuts:
        oa, sa = fn(q[:cut], k[:cut], v[:cut], g[:cut], beta[:cut], s0)
        ob, sb = fn(q[cut:], k[cut:], v[cut:], g[cut:], beta[cut:], sa)
        assert close(torch.cat([oa, ob]), o) and close(sb, s)


def _packed(lengths, H=2, K=24, V=40, seed=4, device="cpu"):
    q, k, v, g, beta, _ = _inputs(sum(lengths), H, K, V, seed, device)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    pool = torch.randn(6, H, K, V, generator=torch.Generator().manual_seed(seed)).to(device)
    return q, k, v, g, beta, cu, pool


@pytest.mark.parametrize("rule", ["chunk", "recurrent"])
def test_varlen_sequences_update_their_cells(rule, device, close):
    lengths = [63, 1, 70, 17] if rule == "chunk" else [13, 1, 20, 7]
    cells = [4, 0, 2, 5]
    q, k, v, g, beta, cu, pool = _packed(lengths, device=device)
    want_pool = pool.clone()
    fast = getattr(dispatch, f"{rule}_gated_delta_rule_varlen")
    ref = getattr(ref_varlen, f"{rule}_gated_delta_rule_varlen")
    want = ref(q, k, v, g, beta, cu, want_pool, cells)
    got = fast(q, k, v, g, beta, cu, pool, torch.tensor(cells, device=device))
    assert close(got, want) and close(pool, want_pool)
    assert torch.equal(pool[[1, 3]], want_pool[[1, 3]])     # untouched cells stay as they were


def test_decode_batch_updates_cells_in_place(device, close):
    q, k, v, g, beta, _, pool = _packed([1] * 5, device=device)
    cells = [3, 0, 5, 1, 2]
    want_pool = pool.clone()
    want = ref_varlen.gated_delta_decode(q, k, v, g, beta, want_pool, cells)
    got = dispatch.gated_delta_decode(q, k, v, g, beta, pool, cells)
    assert close(got, want) and close(pool, want_pool)
    assert torch.equal(pool[4], want_pool[4])


def test_strided_cell_pool_of_one_layer(device, close):
    # the model's pool is ssm[:, layer]: cells strided over all layers, contiguous inside
    q, k, v, g, beta, cu, _ = _packed([20, 9], device=device)
    ssm = torch.randn(4, 3, 2, 24, 40, generator=torch.Generator().manual_seed(5)).to(device)
    want = ssm.clone()
    ref_o = ref_varlen.chunk_gated_delta_rule_varlen(q, k, v, g, beta, cu, want[:, 1], [2, 0])
    o = dispatch.chunk_gated_delta_rule_varlen(q, k, v, g, beta, cu, ssm[:, 1], [2, 0])
    assert close(o, ref_o) and close(ssm, want)


@pytest.mark.parametrize("rule", ["chunk", "recurrent"])
def test_half_precision_inputs(rule, device, close):
    # the GPU's bf16 path with the values the interpreter computes right: fp16 operands
    # into the dots (q, k in fp32 as the model passes them, rounded there), fp32 sums
    q, k, v, g, beta, s0 = _inputs(100, H=2, K=64, V=64, seed=6, device=device)
    want_o, want_s = naive.recurrent_gated_delta_rule(q, k, v.half().float(), g, beta, s0)
    fn = dispatch.chunk_gated_delta_rule if rule == "chunk" else \
        dispatch.recurrent_gated_delta_rule
    o, s = fn(q, k, v.half(), g, beta, s0)
    assert o.dtype == torch.float16
    assert close(o, want_o, 1e-2) and close(s, want_s, 1e-2)


def test_bad_inputs_raise_value_error(device):
    q, k, v, g, beta, s0 = _inputs(8, device=device)
    with pytest.raises(ValueError, match="initial_state"):
        dispatch.chunk_gated_delta_rule(q, k, v, g, beta, s0[:, :5])
    with pytest.raises(ValueError, match="g, beta"):
        dispatch.recurrent_gated_delta_rule(q, k, v, g[:, :2], beta)
    with pytest.raises(ValueError, match="chunk_size"):
        dispatch.chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=48)
    pool = torch.zeros(2, 3, 24, 40, dtype=torch.float64, device=device)
    with pytest.raises(ValueError, match="float32"):
        dispatch.chunk_gated_delta_rule_varlen(q, k, v, g, beta, [0, 8], pool, [0])
    with pytest.raises(ValueError, match="cu_seqlens"):
        dispatch.chunk_gated_delta_rule_varlen(q, k, v, g, beta, [0, 5], pool.float(), [0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 is wrong in the interpreter")
@pytest.mark.parametrize("rule", ["chunk", "recurrent"])
def test_bf16_on_gpu(rule, close):
    q, k, v, g, beta, s0 = _inputs(1500, H=8, K=128, V=128, device="cuda", dtype=torch.bfloat16)
    want_o, want_s = naive.recurrent_gated_delta_rule(q.float(), k.float(), v.float(), g, beta,
                                                      s0)
    fn = dispatch.chunk_gated_delta_rule if rule == "chunk" else \
        dispatch.recurrent_gated_delta_rule
    o, s = fn(q, k, v, g, beta, s0)
    assert o.dtype == torch.bfloat16
    assert close(o, want_o, 2e-2) and close(s, want_s, 2e-2)

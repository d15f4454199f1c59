"""Mamba2's scan (SSD): the plain-torch forms against each other and transformers', and
the Triton kernels (chunked prefill, step by step) against them."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels import dispatch
from ckptd.kernels.mamba2 import chunk, fused_recurrent, naive
from ckptd.kernels.mamba2 import reference_varlen as ref_varlen

pytestmark = pytest.mark.usefixtures("triton_env")


def _inputs(T, H=4, P=24, G=2, N=20, seed=0, device="cpu", dtype=torch.float32):
    """x, dt, A, B, C, D, s0 as the model makes them: dt > 0 after softplus, A < 0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, P, generator=g)
    dt = torch.nn.functional.softplus(torch.randn(T, H, generator=g) - 1)
    A = -torch.exp(torch.rand(H, generator=g) * 2 - 1)
    B = torch.randn(T, G, N, generator=g)
    C = torch.randn(T, G, N, generator=g)
    D = torch.randn(H, generator=g)
    s0 = torch.randn(H, P, N, generator=g)
    return [t.to(device, dtype if i in (0, 3, 4) else torch.float32)
            for i, t in enumerate((x, dt, A, B, C, D, s0))]


@pytest.mark.parametrize("T", [1, 17, 64, 150])
def test_naive_chunked_equals_recurrent_and_transformers(T, close):
    from transformers.models.mamba2.modeling_mamba2 import mamba2_chunk_scan
    x, dt, A, B, C, D, s0 = _inputs(T)
    want_y, want_s = naive.ssd_recurrent(x, dt, A, B, C, D, s0)
    for L in (16, 64):
        y, s = naive.ssd_chunked(x, dt, A, B, C, D, s0, chunk_size=L)
        assert close(y, want_y) and close(s, want_s)
    # transformers' own torch scan: an independent writing of the same rule
    hf_y, hf_s = mamba2_chunk_scan(x[None], dt[None], A, B[None], C[None], chunk_size=16, D=D,
                                   initial_states=s0[None], return_final_states=True)
    assert close(hf_y[0], want_y) and close(hf_s[0], want_s)


# the interpreter runs the step-by-step kernel ~10 ms a token: it gets shorter sequences
@pytest.mark.parametrize(("T", "rule"), [(1, "chunk"), (63, "chunk"), (150, "chunk"),
                                         (1, "recurrent"), (63, "recurrent")])
def test_single_sequence_equals_reference(T, rule, device, close):
    x, dt, A, B, C, D, s0 = _inputs(T, device=device)
    want_y, want_s = naive.ssd_chunked(x, dt, A, B, C, D, s0)
    fn = chunk.ssd_chunked if rule == "chunk" else fused_recurrent.ssd_recurrent
    y, s = fn(x, dt, A, B, C, D, s0)
    assert y.dtype == x.dtype and s.dtype == torch.float32
    assert close(y, want_y) and close(s, want_s)


@pytest.mark.parametrize("rule", ["chunk", "recurrent"])
def test_no_initial_state_and_no_skip(rule, device, close):
    x, dt, A, B, C, _, _ = _inputs(40, seed=5, device=device)
    want_y, want_s = naive.ssd_recurrent(x, dt, A, B, C)
    fn = chunk.ssd_chunked if rule == "chunk" else fused_recurrent.ssd_recurrent
    y, s = fn(x, dt, A, B, C)
    assert close(y, want_y) and close(s, want_s)


@pytest.mark.parametrize("chunk_size", [16, 32, 128])
def test_chunk_sizes(chunk_size, device, close):
    x, dt, A, B, C, D, s0 = _inputs(100, H=2, P=40, G=1, N=16, seed=1, device=device)
    want_y, want_s = naive.ssd_recurrent(x, dt, A, B, C, D, s0)
    y, s = chunk.ssd_chunked(x, dt, A, B, C, D, s0, chunk_size=chunk_size)
    assert close(y, want_y) and close(s, want_s)


@pytest.mark.parametrize(("rule", "T", "cuts"), [("chunk", 100, (64, 71)),
                                                ("recurrent", 30, (13,))])
def test_two_chunks_carrying_state_equal_one_shot(rule, T, cuts, device, close):
    x, dt, A, B, C, D, s0 = _inputs(T, seed=3, device=device)
    fn = chunk.ssd_chunked if rule == "chunk" else fused_recurrent.ssd_recurrent
    y, s = fn(x, dt, A, B, C, D, s0)
    for cut in cuts:
        ya, sa = fn(x[:cut], dt[:cut], A, B[:cut], C[:cut], D, s0)
        yb, sb = fn(x[cut:], dt[cut:], A, B[cut:], C[cut:], D, sa)
        assert close(torch.cat([ya, yb]), y) and close(sb, s)


def test_prefill_in_chunks_equals_token_by_token(device, close):
    """The property the cache rests on: prefill chunked, then decode a token at a time,
    is the same as one token after another from the start."""
    x, dt, A, B, C, D, s0 = _inputs(90, seed=6, device=device)
    pool = s0[None].clone()
    ys = [dispatch.ssd_varlen(x[:80], dt[:80], A, B[:80], C[:80], D, [0, 80], pool, [0])]
    for t in range(80, 90):
        ys.append(dispatch.ssd_varlen(x[t:t + 1], dt[t:t + 1], A, B[t:t + 1], C[t:t + 1], D,
                                      [0, 1], pool, [0], chunked=False))
    want_y, want_s = naive.ssd_recurrent(x, dt, A, B, C, D, s0)
    assert close(torch.cat(ys), want_y) and close(pool[0], want_s)


def _packed(lengths, seed=4, device="cpu", **kw):
    x, dt, A, B, C, D, _ = _inputs(sum(lengths), seed=seed, device=device, **kw)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    H, P, N = x.shape[1], x.shape[2], B.shape[2]
    pool = torch.randn(6, H, P, N, generator=torch.Generator().manual_seed(seed)).to(device)
    return x, dt, A, B, C, D, cu, pool


@pytest.mark.parametrize("chunked", [True, False])
def test_varlen_sequences_update_their_cells(chunked, device, close):
    lengths, cells = [63, 1, 70, 17], [4, 0, 2, 5]
    x, dt, A, B, C, D, cu, pool = _packed(lengths, device=device)
    want_pool = pool.clone()
    want = ref_varlen.ssd_varlen(x, dt, A, B, C, D, cu, want_pool, cells, chunked=False)
    got = dispatch.ssd_varlen(x, dt, A, B, C, D, cu, pool, torch.tensor(cells, device=device),
                              chunked=chunked)
    assert close(got, want) and close(pool, want_pool)
    assert torch.equal(pool[[1, 3]], want_pool[[1, 3]])     # untouched cells stay as they were


def test_decode_batch_updates_cells_in_place(device, close):
    x, dt, A, B, C, D, _, pool = _packed([1] * 5, device=device)
    cells = [3, 0, 5, 1, 2]
    want_pool = pool.clone()
    want = ref_varlen.ssd_varlen(x, dt, A, B, C, D, list(range(6)), want_pool, cells)
    got = fused_recurrent.ssd_decode(x, dt, A, B, C, D, pool, cells)
    assert close(got, want) and close(pool, want_pool)
    assert torch.equal(pool[4], want_pool[4])


def test_one_head_per_program_launch(device, close):
    # the launch shape a GPU uses, checked on whatever device runs the tests
    x, dt, A, B, C, D, cu, pool = _packed([5, 12], device=device)
    want_pool = pool.clone()
    want = ref_varlen.ssd_varlen(x, dt, A, B, C, D, cu, want_pool, [1, 3])
    got = fused_recurrent.ssd_recurrent_varlen(x, dt, A, B, C, D, cu, pool, [1, 3],
                                               heads_per_program=1)
    assert close(got, want) and close(pool, want_pool)


def test_strided_rows_and_pool_of_one_layer(device, close):
    """As the model calls it: x, B and C are column slices of the conv output (rows
    strided), the pool is ssm[:, layer] (cells strided over all layers)."""
    x, dt, A, B, C, D, cu, _ = _packed([20, 9], device=device)
    n, H, P = x.shape
    G, N = B.shape[1:]
    conv = torch.cat([x.reshape(n, -1), B.reshape(n, -1), C.reshape(n, -1)], dim=1)
    xs, Bs, Cs = conv.split([H * P, G * N, G * N], dim=1)
    xs, Bs, Cs = xs.view(n, H, P), Bs.view(n, G, N), Cs.view(n, G, N)
    assert not xs.is_contiguous()
    ssm = torch.randn(4, 3, H, P, N, generator=torch.Generator().manual_seed(5)).to(device)
    want = ssm.clone()
    ref_y = ref_varlen.ssd_varlen(x, dt, A, B, C, D, cu, want[:, 1], [2, 0])
    for chunked in (True, False):
        pool = ssm.clone()
        y = dispatch.ssd_varlen(xs, dt, A, Bs, Cs, D, cu, pool[:, 1], [2, 0], chunked=chunked)
        assert close(y, ref_y) and close(pool, want)


@pytest.mark.parametrize("rule", ["chunk", "recurrent"])
def test_16_bit_inputs_compile_their_types(rule, device):
    """bf16 values are wrong in the interpreter, its type checks are the compiler's: a
    mixed-dtype product would fail here as on a GPU."""
    for dtype in (torch.bfloat16, torch.float16):
        x, dt, A, B, C, D, s0 = _inputs(20, device=device, dtype=dtype)
        fn = chunk.ssd_chunked if rule == "chunk" else fused_recurrent.ssd_recurrent
        y, s = fn(x, dt, A, B, C, D, s0)
        assert y.dtype == dtype and s.dtype == torch.float32


def test_fp16_values(device, close):
    x, dt, A, B, C, D, s0 = _inputs(70, device=device, dtype=torch.float16)
    want_y, want_s = naive.ssd_recurrent(x.float(), dt, A, B.float(), C.float(), D, s0)
    for fn in (chunk.ssd_chunked, fused_recurrent.ssd_recurrent):
        y, s = fn(x, dt, A, B, C, D, s0)
        assert close(y, want_y, 1e-2) and close(s, want_s, 1e-2)


def test_bad_inputs_raise_value_error(device):
    x, dt, A, B, C, D, s0 = _inputs(8, device=device)
    with pytest.raises(ValueError, match="initial_state"):
        chunk.ssd_chunked(x, dt, A, B, C, D, s0[:, :5])
    with pytest.raises(ValueError, match="dt"):
        fused_recurrent.ssd_recurrent(x, dt[:, :2], A, B, C, D)
    with pytest.raises(ValueError, match="group count"):
        naive.ssd_recurrent(x, dt, A, B[:, :1].expand(8, 3, 20), C[:, :1].expand(8, 3, 20))
    with pytest.raises(ValueError, match="chunk_size"):
        chunk.ssd_chunked(x, dt, A, B, C, D, chunk_size=48)
    pool = torch.zeros(2, 4, 24, 20, dtype=torch.float64, device=device)
    with pytest.raises(ValueError, match="float32"):
        dispatch.ssd_varlen(x, dt, A, B, C, D, [0, 8], pool, [0])
    with pytest.raises(ValueError, match="cu_seqlens"):
        dispatch.ssd_varlen(x, dt, A, B, C, D, [0, 5], pool.float(), [0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 is wrong in the interpreter")
@pytest.mark.parametrize("rule", ["chunk", "recurrent"])
def test_bf16_on_gpu(rule, close):
    x, dt, A, B, C, D, s0 = _inputs(1500, H=16, P=64, G=2, N=128, device="cuda",
                                    dtype=torch.bfloat16)
    want_y, want_s = naive.ssd_chunked(x.float(), dt, A, B.float(), C.float(), D, s0)
    fn = chunk.ssd_chunked if rule == "chunk" else fused_recurrent.ssd_recurrent
    y, s = fn(x, dt, A, B, C, D, s0)
    assert y.dtype == torch.bfloat16
    assert close(y, want_y, 2e-2) and close(s, want_s, 2e-2)

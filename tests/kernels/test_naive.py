"""The plain-torch references agree with each other and with dense math."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels import ops


def _gdn_inputs(T, H=3, K=24, V=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = ops.l2norm(torch.randn(T, H, K, generator=g))
    k = ops.l2norm(torch.randn(T, H, K, generator=g))
    v = torch.randn(T, H, V, generator=g)
    decay = -torch.rand(T, H, generator=g)
    beta = torch.rand(T, H, generator=g)
    s0 = torch.randn(H, K, V, generator=g)
    return q, k, v, decay, beta, s0


@pytest.mark.parametrize("T", [1, 63, 64, 65, 500])
def test_chunked_delta_rule_equals_recurrent(T):
    q, k, v, g, beta, s0 = _gdn_inputs(T)
    o1, s1 = ops.recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    o2, s2 = ops.chunk_gated_delta_rule(q, k, v, g, beta, s0)
    assert (o1 - o2).abs().max() <= 1e-5
    assert (s1 - s2).abs().max() <= 1e-5


def test_delta_rule_two_chunks_equal_one_shot():
    q, k, v, g, beta, s0 = _gdn_inputs(150, seed=1)
    o, s = ops.chunk_gated_delta_rule(q, k, v, g, beta, s0)
    oa, sa = ops.chunk_gated_delta_rule(q[:70], k[:70], v[:70], g[:70], beta[:70], s0)
    ob, sb = ops.chunk_gated_delta_rule(q[70:], k[70:], v[70:], g[70:], beta[70:], sa)
    assert (torch.cat([oa, ob]) - o).abs().max() <= 1e-5
    assert (sb - s).abs().max() <= 1e-5


def test_conv_chunks_and_update_equal_one_shot():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(50, 12, generator=g)
    w = torch.randn(12, 4, generator=g)
    y, st = ops.causal_conv1d(x, w)
    ya, sa = ops.causal_conv1d(x[:17], w)
    yb, sb = ops.causal_conv1d(x[17:], w, None, sa)
    assert torch.allclose(torch.cat([ya, yb]), y, atol=1e-6) and torch.equal(sb, st)
    state = torch.zeros(1, 12, 3)
    steps = []
    for t in range(50):
        out, state = ops.causal_conv1d_update(x[t:t + 1], state, w)
        steps.append(out)
    assert torch.allclose(torch.cat(steps), y, atol=1e-6)
    assert torch.equal(state[0], st)


def test_paged_attention_equals_dense_causal():
    g = torch.Generator().manual_seed(3)
    B, Hq, Hkv, D, L = 4, 6, 2, 8, 11
    pool = torch.zeros(8, 1, 2, B, Hkv, D)
    table = torch.tensor([5, 2, 7], dtype=torch.int32)       # scattered pages
    k, v = torch.randn(L, Hkv, D, generator=g), torch.randn(L, Hkv, D, generator=g)
    kv_index = table.long()[torch.arange(L) // B] * B + torch.arange(L) % B
    ops.write_kv(pool, 0, kv_index, k, v)
    q = torch.randn(L, Hq, D, generator=g)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(3, 1).transpose(0, 1),
        v.repeat_interleave(3, 1).transpose(0, 1), is_causal=True).transpose(0, 1)
    got = ops.paged_attention(q, pool, 0, table, 0, D ** -0.5)
    assert (got - want).abs().max() <= 1e-5
    tail = ops.paged_attention(q[7:], pool, 0, table, 7, D ** -0.5)
    assert (tail - want[7:]).abs().max() <= 1e-5
    dec = ops.paged_decode_attention(q[L - 1:], pool, 0, table[None], torch.tensor([L]), D ** -0.5)
    assert (dec[0] - want[L - 1]).abs().max() <= 1e-5


def test_pages_gather_scatter_round_trip():
    pool = torch.randn(6, 2, 2, 4, 2, 8)
    pages = ops.gather_pages(pool, [4, 1])
    other = torch.zeros_like(pool)
    ops.scatter_pages(other, [0, 3], pages)
    assert torch.equal(other[0], pool[4]) and torch.equal(other[3], pool[1])

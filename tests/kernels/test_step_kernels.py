"""The model-facing step ops (one call per layer, driven by a Varlen) against the
references, at the head dims of the models served: 64 (SmolLM2), 128 (Qwen3.5's
delta-rule heads, many attention layers), 256 (Qwen3.5 / 3.6 full attention). On the
CPU the Triton kernels run interpreted in fp32 on small shapes; on a GPU also bf16
inputs (fp32 accumulation and state) at real shapes."""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels import dispatch
from ckptd.kernels.conv1d import reference_varlen as conv_ref
from ckptd.kernels.gated_delta import naive as gdn_naive
from ckptd.kernels.gated_delta import reference_varlen as gdn_ref
from ckptd.kernels.paged_attention import reference_varlen as attn_ref
from ckptd.model.batch import SeqChunk, StepBatch
from tests.kernels.test_triton_attention import _filled

pytestmark = pytest.mark.usefixtures("triton_env")
GPU = torch.cuda.is_available()


def _varlen(ctx, q_lens, tables, cells, device, B=16):
    seqs, q = [], 0
    for i, (c, n) in enumerate(zip(ctx, q_lens)):
        pages = -(-(c + n) // B)
        seqs.append(SeqChunk(q, n, c, tables[i, :pages].cpu(), cells[i]))
        q += n
    return StepBatch.build(seqs, [0] * q, [q - 1], B, torch.device(device)).varlen


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("shape", ["mixed", "decode"])
def test_step_attention_head_dims(D, shape, device, close):
    ctx, q_lens = ([0, 30, 7], [20, 1, 5]) if shape == "mixed" else ([12, 40, 3], [1, 1, 1])
    pool, tables = _filled([c + n for c, n in zip(ctx, q_lens)], Hkv=2, D=D, seed=D,
                           device=device)
    v = _varlen(ctx, q_lens, tables, [0, 1, 2], device)
    q = torch.randn(sum(q_lens), 4, D, generator=torch.Generator().manual_seed(D)).to(device)
    want = attn_ref.paged_attention_varlen(q, pool, 1, list(v.cu), ctx, tables, D ** -0.5)
    assert v.decode_only == (shape == "decode")
    assert close(dispatch.step_attention(q, pool, 1, v, D ** -0.5), want)


def test_step_attention_fp32_head_dim_256_on_a_small_shared_memory_card(device, close):
    # an RTX 3090 / 4090 / L4 (sm_86 / sm_89: 101,376 B a block) takes fp32 keys in blocks
    # of 32 at head dim 256 (kernels/launch.py: attention); more than one block of them
    from ckptd.kernels import launch

    ctx, q_lens, D = [0, 70], [20, 1], 256
    pool, tables = _filled([c + n for c, n in zip(ctx, q_lens)], Hkv=2, D=D, seed=3,
                           device=device)
    v = _varlen(ctx, q_lens, tables, [0, 1], device)
    q = torch.randn(sum(q_lens), 4, D, generator=torch.Generator().manual_seed(5)).to(device)
    want = attn_ref.paged_attention_varlen(q, pool, 1, list(v.cu), ctx, tables, D ** -0.5)
    t = launch.Target(86, 84)
    assert launch.attention(t, D, 40, torch.float32)["BN"] == 32
    with launch.forced(t):
        assert close(dispatch.step_attention(q, pool, 1, v, D ** -0.5), want)


def _gdn(N, H, K, V, seed, device, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = gdn_naive.l2norm(torch.randn(N, H, K, generator=g))
    k = gdn_naive.l2norm(torch.randn(N, H, K, generator=g))
    v = torch.randn(N, H, V, generator=g)
    decay, beta = -torch.rand(N, H, generator=g), torch.rand(N, H, generator=g)
    return [x.to(device, dtype if i < 3 else torch.float32)
            for i, x in enumerate((q, k, v, decay, beta))]


@pytest.mark.parametrize("K", [64, 128])
@pytest.mark.parametrize("q_lens", [[70, 1, 9], [1, 1, 1, 1]])
def test_step_gated_delta_and_conv(K, q_lens, device, close):
    ctx = [5] * len(q_lens)
    cells = [3, 0, 2, 1][:len(q_lens)]
    tables = torch.zeros(len(q_lens), 8, dtype=torch.int32)
    v = _varlen(ctx, q_lens, tables, cells, device)
    N, H = sum(q_lens), 2
    q, k, vv, g, beta = _gdn(N, H, K, K, K, device)
    pool = torch.randn(5, H, K, K, generator=torch.Generator().manual_seed(1)).to(device)
    want_pool = pool.clone()
    want = gdn_ref.chunk_gated_delta_rule_varlen(q, k, vv, g, beta, list(v.cu), want_pool, cells)
    got = dispatch.step_gated_delta(q, k, vv, g, beta, pool, v)
    assert close(got, want, 1e-4) and close(pool, want_pool, 1e-4)
    C, W = 3 * K, 4
    x = torch.randn(N, C, generator=torch.Generator().manual_seed(2)).to(device)
    w = torch.randn(C, W, generator=torch.Generator().manual_seed(3)).to(device)
    conv = torch.randn(5, C, W - 1, generator=torch.Generator().manual_seed(4)).to(device)
    want_conv = conv.clone()
    want = conv_ref.causal_conv1d_varlen(x, w, None, list(v.cu), want_conv, cells)
    got = dispatch.step_conv1d(x, w, conv, v)
    assert close(got, want) and close(conv, want_conv)


@pytest.mark.skipif(not GPU, reason="bf16 is wrong in the interpreter")
@pytest.mark.parametrize("D", [64, 128, 256])
def test_step_attention_bf16_on_gpu(D, close):
    ctx, q_lens = [3000, 0, 700, 64], [1, 500, 64, 1]
    pool, tables = _filled([c + n for c, n in zip(ctx, q_lens)], Hkv=2, D=D, device="cuda",
                           dtype=torch.bfloat16)
    v = _varlen(ctx, q_lens, tables, [0, 1, 2, 3], "cuda")
    q = torch.randn(sum(q_lens), 16, D, device="cuda", dtype=torch.bfloat16)
    want = attn_ref.paged_attention_varlen(q, pool, 1, list(v.cu), ctx, tables, D ** -0.5)
    assert close(dispatch.step_attention(q, pool, 1, v, D ** -0.5), want, 2e-2)


@pytest.mark.skipif(not GPU, reason="bf16 is wrong in the interpreter")
def test_step_gated_delta_bf16_inputs_fp32_state_on_gpu(close):
    q_lens = [1000, 1, 300]
    v = _varlen([0, 9, 0], q_lens, torch.zeros(3, 80, dtype=torch.int32), [2, 0, 1], "cuda")
    q, k, vv, g, beta = _gdn(sum(q_lens), 32, 128, 128, 7, "cuda", torch.bfloat16)
    pool = torch.randn(3, 32, 128, 128, device="cuda") * 0.1
    want_pool = pool.clone()
    want = gdn_ref.chunk_gated_delta_rule_varlen(q, k, vv, g, beta, list(v.cu), want_pool,
                                                 [2, 0, 1])
    got = dispatch.step_gated_delta(q, k, vv, g, beta, pool, v)
    assert pool.dtype == torch.float32 and got.dtype == torch.bfloat16
    assert close(got, want, 3e-2) and close(pool, want_pool, 1e-2)

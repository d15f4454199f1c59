"""Every Triton kernel run once on bf16 inputs, with the launches a GPU makes.

The interpreter's bf16 values are wrong (it computes on raw bit patterns), but its type
checks are the compiler's: a tl.dot of a bf16 and an fp32 operand fails here as on a
GPU. Each op goes through kernels/dispatch.py as the model calls it (the Gated DeltaNet
with fp32 q and k from l2norm beside bf16 values, as model/arch/gdn.py passes them), and
the last test checks that these runs launched every kernel of kernels/.
"""

from __future__ import annotations

import pytest
import torch

from ckptd.kernels import dispatch
from tests.kernels.kernel_index import all_kernels
from tests.kernels.quant_data import ALL_FORMATS, kept
from tests.kernels.test_step_kernels import _varlen

pytestmark = pytest.mark.usefixtures("triton_env")
BF16 = torch.bfloat16
LAUNCHED: set[str] = set()        # kernels launched by this module's tests so far
RAN: set[str] = set()             # and the tests that ran


@pytest.fixture(autouse=True)
def record(monkeypatch, request):
    """Note the kernels each test launches (under the interpreter or on a GPU)."""
    from triton.runtime import interpreter, jit

    RAN.add(request.node.originalname)
    for cls in (interpreter.InterpretedFunction, jit.JITFunction):
        run = cls.run

        def noted(self, *args, run=run, **kwargs):
            LAUNCHED.add(f"{self.fn.__module__.rsplit('.', 1)[-1]}.{self.fn.__name__}")
            return run(self, *args, **kwargs)
        monkeypatch.setattr(cls, "run", noted)


def _rand(*shape, seed=0, device="cpu", dtype=BF16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device, dtype)


@pytest.mark.parametrize("qk", [torch.float32, BF16], ids=["qk-fp32", "qk-bf16"])
def test_gated_delta_rule(qk, device):
    q_lens = [70, 1, 9]
    v = _varlen([5, 3, 0], q_lens, torch.zeros(3, 8, dtype=torch.int32), [2, 0, 1], device)
    N, H, K = sum(q_lens), 2, 128
    q, k = _rand(N, H, K, device=device).to(qk), _rand(N, H, K, seed=1, device=device).to(qk)
    vv = _rand(N, H, K, seed=2, device=device)
    g = -torch.rand(N, H, device=device)
    beta = torch.rand(N, H, device=device)
    pool = torch.zeros(3, H, K, K, device=device)
    o = dispatch.step_gated_delta(q, k, vv, g, beta, pool, v)               # chunked
    assert o.dtype == BF16 and o.shape == vv.shape and pool.dtype == torch.float32
    d = _varlen([5, 3, 0], [1, 1, 1], torch.zeros(3, 8, dtype=torch.int32), [2, 0, 1], device)
    o = dispatch.step_gated_delta(q[:3], k[:3], vv[:3], g[:3], beta[:3], pool, d)  # decode
    assert o.dtype == BF16 and o.shape == (3, H, K)
    assert dispatch.l2norm(vv).dtype == torch.float32


def test_conv(device):
    v = _varlen([5, 0], [70, 9], torch.zeros(2, 8, dtype=torch.int32), [1, 0], device)
    x, w = _rand(79, 96, device=device), _rand(96, 4, seed=1, device=device)
    pool = _rand(2, 96, 3, seed=2, device=device)
    assert dispatch.step_conv1d(x, w, pool, v).dtype == BF16
    d = _varlen([5, 9], [1, 1], torch.zeros(2, 8, dtype=torch.int32), [1, 0], device)
    assert dispatch.step_conv1d(x[:2], w, pool, d).shape == (2, 96)


def test_attention_and_pages(device):
    from tests.kernels.test_triton_attention import _filled

    D, ctx, q_lens = 256, [0, 600, 7], [9, 1, 2]
    pool, tables = _filled([c + n for c, n in zip(ctx, q_lens)], Hkv=2, D=D, device=device,
                           dtype=BF16)
    v = _varlen(ctx, q_lens, tables, [0, 1, 2], device)
    q = _rand(sum(q_lens), 16, D, device=device)
    assert dispatch.step_attention(q, pool, 1, v, D ** -0.5).dtype == BF16   # no split
    d = _varlen(ctx, [1, 1, 1], tables, [0, 1, 2], device)
    assert dispatch.step_attention(q[:3], pool, 1, d, D ** -0.5).shape == (3, 16, D)  # split
    dispatch.write_kv(pool, 0, torch.tensor([3, 9], device=device), q[:2, :2], q[2:4, :2])
    pages = dispatch.gather_pages(pool, [1, 0])
    dispatch.scatter_pages(pool, torch.tensor([2, 3], device=device), pages)


def test_pointwise(device):
    x, z = _rand(33, 256, device=device), _rand(33, 256, seed=1, device=device)
    w = _rand(256, seed=2, device=device)
    assert dispatch.rms_norm(x, w, 1e-6, 1.0).dtype == BF16
    assert dispatch.gated_rms_norm(x, z, w, 1e-6).dtype == BF16
    cos, sin = dispatch.rotary_cos_sin(torch.arange(33, device=device), 64, 1e4)
    assert dispatch.apply_rotary(x.view(33, 1, 256), cos, sin).dtype == BF16
    assert dispatch.silu_and_mul(x, z).dtype == BF16


def test_moe_experts(device):
    E, k, H, inter = 8, 2, 64, 32
    ids = torch.randint(0, E, (70, k), generator=torch.Generator().manual_seed(0)).to(device)
    w = torch.rand(70, k, device=device)
    x = _rand(70, H, device=device)
    w13, w2 = _rand(E, 2 * inter, H, seed=1, device=device), _rand(E, H, inter, seed=2,
                                                                    device=device)
    for n in (70, 3):                        # blocks of 64 rows (prefill), of 16 (decode)
        assert dispatch.moe_experts(x[:n], ids[:n], w[:n], w13, w2).dtype == BF16


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_kept_matmul(fmt, device):
    # the format is a runtime argument of one compiled kernel: each one's branch, in bf16
    qt = kept(fmt, 64, 256, seed=1)
    qt = type(qt)(qt.data.to(device), qt.fmt, qt.shape)
    assert dispatch.quant_matmul(_rand(2, 256, device=device), qt).dtype == BF16


def test_kept_experts(device):
    # the grouped kernel reads kept tiles through the same weight_tile as the matmul
    E, inter, H = 2, 256, 256
    gate, up = kept("Q4_K", inter, H, (E,), seed=2), kept("Q6_K", inter, H, (E,), seed=3)
    down = kept("Q8_0", H, inter, (E,), seed=4)
    gate, up, down = (type(t)(t.data.to(device), t.fmt, t.shape) for t in (gate, up, down))
    # one token: a GEMV per (token, expert) pair (kernels/quant/gemv.py); nine: the grouped
    # GEMM over kept tiles
    for n in (1, 9):
        x, ids = _rand(n, 256, device=device), torch.tensor([[1, 0]] * n, device=device)
        out = dispatch.quant_moe_experts(x, ids, torch.rand(n, 2, device=device), gate, up,
                                         down)
        assert out.dtype == BF16 and out.shape == (n, 256)


def test_every_kernel_ran_on_bf16():
    # runs after the tests above (file order; under xdist with --dist loadfile)
    others = {n for n in globals() if n.startswith("test_")} - {"test_every_kernel_ran_on_bf16"}
    if not others <= RAN:
        pytest.skip(f"needs the module's other tests to run first: {sorted(others - RAN)}")
    assert all_kernels() - LAUNCHED == set()

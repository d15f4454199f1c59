"""Launch parameters of every Triton kernel: one function per kernel, from the target
(compute capability, multiprocessors), the shape and the dtype.

The launchers call these on every device, so one set of block sizes, warps and stages
is what a GPU runs, what the interpreter runs in the CPU tests, and what the compile
gate (tools/gate) compiles for sm_80/86/89/90 and holds to each target's shared memory:

    t = target(x.device)             # CUDA: the device's; CPU (interpreted): DEFAULT
    p = attention(t, D=256, rows=64, dtype=torch.bfloat16)
    kernel[grid](..., **p.kwargs())

Shape-dependent choices take few values (attention's 16 or 64 rows a block, say): each
is a compile, on the GPU's first use and in the gate. `forced(t)` makes every device
look like t (the gate runs the launchers on meta tensors for each target).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Target:
    cc: int        # compute capability, major * 10 + minor
    sms: int       # multiprocessors: how many programs fill the device


# per-block shared memory (opt-in) of the targets ckptd serves on: A100; RTX 30x0 / A10;
# RTX 40x0 / L4 / L40; H100 / H200
SHARED_LIMIT = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448}
GATE_TARGETS = (Target(80, 108), Target(86, 84), Target(89, 58), Target(90, 132))
DEFAULT = Target(90, 132)   # what a CPU (the interpreter) runs: an H100's launches


def shared_limit(t: Target) -> int:
    """t's shared memory per block; a card not listed is taken as the smallest."""
    return SHARED_LIMIT.get(t.cc, min(SHARED_LIMIT.values()))


_forced: ContextVar[Target | None] = ContextVar("ckptd_launch_target", default=None)


def target(device: torch.device) -> Target:
    t = _forced.get()
    if t is not None:
        return t
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return Target(p.major * 10 + p.minor, p.multi_processor_count)
    return DEFAULT


@contextmanager
def forced(t: Target) -> Iterator[None]:
    """Launch every kernel with t's parameters, whatever the tensors' device."""
    token = _forced.set(t)
    try:
        yield
    finally:
        _forced.reset(token)


@dataclass(frozen=True)
class Launch:
    constexprs: dict = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2

    def kwargs(self) -> dict:
        return {**self.constexprs, "num_warps": self.num_warps, "num_stages": self.num_stages}

    def __getitem__(self, name: str) -> int:
        return self.constexprs[name]


def pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision: fp32 operands multiply exactly ("ieee"); bf16 / fp16
    operands run on tensor cores whatever this says."""
    return "ieee" if dtype == torch.float32 else "tf32"


# gated delta rule (kernels/gated_delta): K and V in slabs of 64 columns

SLAB = 64


def gdn_slab(K: int) -> int:
    """Columns of k (and rows of the state) one tl.dot takes: 64, or all of a smaller K."""
    return min(SLAB, max(16, pow2(K)))


def gdn_prepare(t: Target, K: int, V: int, dtype: torch.dtype, chunk: int) -> Launch:
    """chunk.py's _prepare_kernel: k.k^T, the triangular solve, w and u of one chunk."""
    return Launch({"BT": chunk, "BK": gdn_slab(K), "BV": gdn_slab(V),
                   "PREC": dot_precision(dtype)}, num_warps=4, num_stages=1)


def gdn_state(t: Target, K: int, V: int, dtype: torch.dtype, chunk: int) -> Launch:
    """chunk_state.py's _state_kernel: the chunks of a sequence in order, state in
    registers as up to four [64, BV] slabs."""
    if K > 4 * SLAB:
        raise ValueError(f"the chunked delta rule takes key heads of up to {4 * SLAB}, got {K}")
    BV = min(32 if dtype == torch.float32 else 64, max(16, pow2(V)))
    return Launch({"BT": chunk, "BK": gdn_slab(K), "BV": BV, "PREC": dot_precision(dtype)},
                  num_warps=4, num_stages=1)


def gdn_output(t: Target, K: int, V: int, dtype: torch.dtype, chunk: int) -> Launch:
    """chunk_state.py's _output_kernel: one chunk's output from its starting state."""
    return Launch({"BT": chunk, "BK": gdn_slab(K), "BV": min(64, max(16, pow2(V))),
                   "PREC": dot_precision(dtype)}, num_warps=4, num_stages=1)


def gdn_recurrent(t: Target, H: int, K: int, V: int) -> Launch:
    """fused_recurrent.py: one head per program, the state [K, BV] in registers."""
    return Launch({"BH": 1, "BK": pow2(K), "BV": min(pow2(V), 32)}, num_warps=4)


# attention over paged KV (kernels/paged_attention)


def attention(t: Target, D: int, rows: int, dtype: torch.dtype) -> Launch:
    """triton_attention.py's _paged_attn_kernel. rows: the longest chunk's query rows of
    one KV head (q_len x query heads per KV head): up to 16 (decode) a block of 16, else
    64 (bf16 / fp16 on tensor cores: each key block serves 64 rows). fp32 multiplies
    exactly on CUDA cores, where bigger blocks buy nothing but registers: always 16.
    Key blocks of 64, but fp32 ones at head dim 256 on a card of 101,376 B a block (RTX
    30x0 / 40x0, L4): their k and v tiles alone take 128 KB there (the gate measured
    151,616 B), so 32 keys."""
    BD = max(16, pow2(D))
    BR = 16 if rows <= 16 or dtype == torch.float32 else 64
    BN = 32 if dtype == torch.float32 and BD >= 256 and shared_limit(t) < 150_000 else 64
    return Launch({"BD": BD, "BR": BR, "BN": BN, "PREC": dot_precision(dtype)},
                  num_warps=4 if BD <= 128 else 8, num_stages=2)


def attention_splits(t: Target, programs: int, max_keys: int) -> int:
    """Key ranges attended in parallel and merged (flash-decoding): enough programs to
    fill the device twice over, each range at least 512 keys."""
    return max(1, min(-(-2 * t.sms // programs), -(-max_keys // 512)))


def attention_combine(t: Target, D: int) -> Launch:
    """The merge of split key ranges: one (token, query head) a program, 16 ranges at a
    time."""
    return Launch({"BS": 16, "BD": max(16, pow2(D))}, num_warps=4)


def write_kv(t: Target, Hkv: int, D: int) -> Launch:
    return Launch({"BH": pow2(Hkv), "BD": pow2(D)}, num_warps=1)


def copy_rows(t: Target, numel: int) -> Launch:
    return Launch({"BLOCK": min(4096, pow2(max(numel, 1)))}, num_warps=4)


# causal conv1d (kernels/conv1d)


def conv_prefill(t: Target, C: int) -> Launch:
    return Launch({"BT": 64, "BC": min(128, pow2(C))}, num_warps=4)


def conv_state(t: Target, C: int, KW: int) -> Launch:
    return Launch({"BS": pow2(KW - 1), "BC": min(128, pow2(C))}, num_warps=4)


def conv_update(t: Target, C: int, KW: int) -> Launch:
    return Launch({"BW": pow2(KW), "BC": min(128, pow2(C))}, num_warps=4)


# pointwise: norms, rotary, SwiGLU


def rows_norm(t: Target, D: int) -> Launch:
    """triton_norm.py: about 2K elements a program."""
    BD = pow2(D)
    return Launch({"BM": max(1, 2048 // BD), "BD": BD}, num_warps=4)


def rotary(t: Target, R: int, D: int) -> Launch:
    return Launch({"BM": max(1, 1024 // pow2(D)), "BHALF": pow2(R // 2),
                   "BREST": pow2(max(D - R, 1))}, num_warps=4)


def swiglu(t: Target) -> Launch:
    return Launch({"BLOCK": 1024}, num_warps=4)


# matmuls over grouped experts and kept (GGUF-format) weights (kernels/moe, kernels/quant)


def grouped_rows(n_pairs: int, n_experts: int) -> int:
    """Rows per block of the grouped GEMM: 64. A decode step's expert gets a row or two of
    a block, but reading (and dequantizing) the expert's weights is the work there, the
    block's idle rows cost tensor-core time only; one block size is one compile."""
    return 64


def grouped_gemm(t: Target, BM: int, dtype: torch.dtype, kept: bool) -> Launch:
    """triton_moe.py's _grouped_kernel (plain or kept experts, kernels/quant/tiles.py)."""
    return Launch({"BM": BM, "BN": 64, "BK": 64 if kept else 32, "PREC": dot_precision(dtype)},
                  num_warps=4, num_stages=2)


def quant_matmul(t: Target, M: int, dtype: torch.dtype) -> Launch:
    """triton_quant.py's _matmul_kernel: blocks of 64 rows whatever M (a decode's row
    leaves most idle: dequantizing the weight tiles is the work), every kept format one
    compile (the format is a runtime argument)."""
    return Launch({"BM": 64, "BN": 64, "BK": 64, "PREC": dot_precision(dtype)},
                  num_warps=4, num_stages=2)


def quant_gemv(t: Target, M: int) -> Launch:
    """kernels/quant/gemv.py's _gemv_kernel on a decode step's 1..8 rows: BM the rows
    (1, 2, 4 or 8: a compile each), 16 output rows a program (a step's [16, 8, 16] byte
    tiles: 16 values of each half a thread at 4 warps)."""
    return Launch({"BM": pow2(M), "BN": 16}, num_warps=4, num_stages=2)


def quant_gemv_split(t: Target, blocks: int, steps: int) -> int:
    """K splits of the kept GEMV: enough programs to give every multiprocessor four
    (N = 4096 makes 256 programs of 16 rows, half of an H100's 528), each split at least
    four 256-value steps (its partial sums are a second pass's reads)."""
    return max(1, min(-(-4 * t.sms // blocks), steps // 4))


def quant_moe_gemv(t: Target) -> Launch:
    """The kept experts' GEMVs of a decode step (gemv.py's moe_experts): one (token,
    expert) pair and 16 output rows a program, no K split (SwiGLU needs whole sums)."""
    return Launch({"BM": 1, "BN": 16}, num_warps=4, num_stages=2)

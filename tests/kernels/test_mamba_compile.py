"""The Mamba kernels build real cubins for the GPUs ckptd targets, without a GPU.

Each kernel is compiled by Triton's own compiler and ptxas (shipped in the triton
wheel) for sm_80 (A100), sm_86 / sm_89 (3090, 4090, L4) and sm_90 (H100, H200), in
bf16, fp16 and fp32, with the launch parameters its dispatch uses (the kernel
module's *_launch function), at the models' shape that needs the most shared memory.
The cubin's shared memory must fit the target's per-block limit: a kernel that
compiles on the CPU interpreter can still fail to launch on a GPU (ENVIRONMENT.md,
"Compiling for a GPU you don't have"). A mixed-dtype product fails here too, as the
compiler's type checks run.

Compiling runs in child processes without TRITON_INTERPRET (the kernel tests'
interpreter patches triton's language in this one), two at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CCS = (80, 86, 89, 90)
DTYPES = ("bf16", "fp16", "fp32")
# bytes of shared memory one block may use (opt-in maximum)
SHARED_LIMIT = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448}

# The shapes, and why they bind: the chunked scan's shared memory grows with the state
# size N (its launch keeps BP * N fixed), the largest being Falcon-H1's N = 256; the
# step-by-step kernels hold everything in registers, so any model's shape stands for all
# (Nemotron-H-8B / Mamba-Codestral: 128 heads of 64, N = 128, 8 groups; Jamba: 8192
# channels of N = 16).
KERNELS = {
    "ssd_chunk": ("ckptd.kernels.mamba2.chunk", "_ssd_chunk_kernel", "chunk_launch",
                  {"P": 64, "N": 256}),
    "ssd_recurrent": ("ckptd.kernels.mamba2.fused_recurrent", "_ssd_recurrent_kernel",
                      "recurrent_launch", {"H": 128, "P": 64, "N": 128}),
    "selective_scan": ("ckptd.kernels.mamba1.triton_scan", "_scan_kernel", "scan_launch",
                       {"D": 8192, "N": 16}),
}

# Runs in a child: compile each job of stdin's JSON list, print the shared bytes of each.
_CHILD = r"""
import importlib, json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# pointer arguments: the activations' dtype ("act"), fp32, or the index types
POINTERS = {"x": "act", "B": "act", "C": "act", "y": "act", "dt": "fp32", "A": "fp32",
            "D": "fp32", "Dskip": "fp32", "pool": "fp32", "state_idx": "i64",
            "cu_seqlens": "i32"}
out = []
for job in json.loads(sys.stdin.read()):
    module = importlib.import_module(job["module"])
    kernel = getattr(module, job["kernel"])
    shape = job["shape"]
    if job["launch"] == "recurrent_launch":
        lp = module.recurrent_launch(job["cc"], shape["H"], shape["P"], shape["N"],
                                     TORCH[job["dtype"]])
    elif job["launch"] == "scan_launch":
        lp = module.scan_launch(job["cc"], shape["D"], shape["N"], TORCH[job["dtype"]])
    else:
        lp = module.chunk_launch(job["cc"], shape["P"], shape["N"], TORCH[job["dtype"]])
    options = {k: lp.pop(k) for k in ("num_warps", "num_stages")}
    consts = {**lp, "HAS_D": True}
    if "P" in kernel.arg_names:
        consts["P"] = shape["P"]
    consts["NS"] = shape["N"]
    if "PREC" in kernel.arg_names:
        consts["PREC"] = module.precision(TORCH[job["dtype"]])
    signature = {}
    for name in kernel.arg_names:
        kind = POINTERS.get(name)
        signature[name] = "constexpr" if name in consts else "i32" if kind is None else \
            "*" + (job["dtype"] if kind == "act" else kind)
    ck = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=consts),
                        target=GPUTarget("cuda", job["cc"], 32), options=options)
    out.append({**job, "shared": ck.metadata.shared, "launch": {**lp, **options}})
print(json.dumps(out))
"""


def _compile(jobs: list[dict]) -> list[dict]:
    """Compile jobs in two child processes; the result of each, in order."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    halves = [jobs[0::2], jobs[1::2]]
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in halves]
    results = []
    for p, half in zip(procs, halves):
        stdout, stderr = p.communicate(json.dumps(half), timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"compiling failed:\n{stderr[-4000:]}")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    merged = []
    for i in range(len(jobs)):
        merged.append(results[i % 2][i // 2])
    return merged


@pytest.fixture(scope="module")
def compiled() -> dict[tuple[str, int, str], dict]:
    jobs = [{"name": name, "module": mod, "kernel": fn, "launch": launch, "shape": shape,
             "cc": cc, "dtype": dtype}
            for name, (mod, fn, launch, shape) in KERNELS.items()
            for cc in CCS for dtype in DTYPES]
    return {(r["name"], r["cc"], r["dtype"]): r for r in _compile(jobs)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cc", CCS)
@pytest.mark.parametrize("name", list(KERNELS))
def test_kernel_compiles_within_shared_memory(compiled, name, cc, dtype):
    r = compiled[name, cc, dtype]
    assert 0 <= r["shared"] <= SHARED_LIMIT[cc], r

"""The Mamba kernels compile for the GPUs ckptd targets, without a GPU.

Each kernel is compiled by Triton's own compiler for sm_80 (A100), sm_86 / sm_89
(3090, 4090, L4) and sm_90 (H100, H200) as far as its shared memory (and, in bf16 on
sm_90, into a cubin by the ptxas shipped in the triton wheel), in
bf16, fp16 and fp32, with the launch parameters its dispatch uses (the kernel
module's *_launch function), at the models' shape that needs the most shared memory.
The shared memory must fit the target's per-block limit: a kernel that
compiles on the CPU interpreter can still fail to launch on a GPU (ENVIRONMENT.md,
"Compiling for a GPU you don't have"). A mixed-dtype product fails here too, as the
compiler's type checks run.

Compiling runs in a child process without TRITON_INTERPRET (the kernel tests'
interpreter patches triton's language in this one), by the compile gate's compile.py:
Triton's stages for the target as far as the shared memory allocation, two at a time.
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

# Runs in a child: each job of stdin's JSON list as the gate's Launch, compiled by the
# gate (tools/gate/compile.py: Triton's stages for the target as far as the shared memory
# allocation, two processes); prints the shared bytes of each.
_CHILD = r"""
import importlib, json, sys
import torch
from ckptd.tools.gate.capture import Launch
from ckptd.tools.gate.compile import CUBIN, SHARED, compile_all

TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# pointer arguments: the activations' dtype ("act"), fp32, or the index types
POINTERS = {"x": "act", "B": "act", "C": "act", "y": "act", "dt": "fp32", "A": "fp32",
            "D": "fp32", "Dskip": "fp32", "pool": "fp32", "state_idx": "i64",
            "cu_seqlens": "i32"}
launches = []
jobs = json.loads(sys.stdin.read())
for job in jobs:
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
    signature = []
    for name in kernel.arg_names:
        kind = POINTERS.get(name)
        if name not in consts:
            signature.append((name, "i32" if kind is None else
                              "*" + (job["dtype"] if kind == "act" else kind)))
    launches.append(Launch(job["module"], job["kernel"], tuple(signature),
                           tuple(consts.items()), options["num_warps"],
                           options["num_stages"], job["cc"]))
    job["launch"] = {**lp, **options}
# each kernel once through ptxas: bf16 on sm_90 (the users' GPU and dtype)
full = {l for l, j in zip(launches, jobs) if j["cc"] == 90 and j["dtype"] == "bf16"}
results = compile_all(launches, 2, depth=lambda l: CUBIN if l in full else SHARED)
for job, launch in zip(jobs, launches):
    r = results[launch]
    if r.error is not None:
        sys.exit(f"{job}: {r.error}")
    job["shared"], job["depth"] = r.shared, r.depth
print(json.dumps(jobs))
"""


def _compile(jobs: list[dict]) -> list[dict]:
    """Compile jobs in a child process (it forks two compiling ones); each job's result."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(jobs), text=True,
                       capture_output=True, env=env, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"compiling failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


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
    assert r["depth"] == ("cubin" if (cc, dtype) == (90, "bf16") else "shared"), r

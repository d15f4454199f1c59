"""Compile captured launches for their GPU target, without a GPU: Triton lowers the
kernel and the ptxas in the triton wheel builds the cubin, so a mixed-dtype tl.dot
fails as on the GPU and `metadata.shared` is the shared memory a block needs.

Each distinct compile (kernel, argument types, constexprs, warps, stages, cc) runs
once, in a pool of processes, longest-looking first.
"""

from __future__ import annotations

import importlib
import os
import resource
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ckptd.tools.gate.capture import Launch


@dataclass(frozen=True)
class Result:
    shared: int | None          # bytes of shared memory per block; None when it failed
    error: str | None
    cpu_s: float                # this compile's CPU seconds, ptxas included


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def compile_one(job: Launch) -> Result:

    t0 = _cpu()
    fn = getattr(importlib.import_module(job.module), job.name)
    while not hasattr(fn, "params"):        # an autotuned / heuristics kernel's JIT function
        fn = fn.fn
    signature = dict(job.signature)
    signature.update({name: "constexpr" for name, _ in job.constexprs})
    signature = {p.name: signature[p.name] for p in fn.params}
    src = ASTSource(fn=fn, signature=signature, constexprs=dict(job.constexprs))
    try:
        ck = triton.compile(src, target=GPUTarget("cuda", job.cc, 32),
                            options={"num_warps": job.num_warps, "num_stages": job.num_stages})
    except Exception as e:  # noqa: BLE001 - a compile error is the gate's finding
        first = str(e).strip().splitlines()
        return Result(None, f"{type(e).__name__}: {' / '.join(first[-3:])[:400]}", _cpu() - t0)
    return Result(int(ck.metadata.shared), None, _cpu() - t0)


def _cost(job: Launch) -> tuple:
    """Heavier compiles first (so two workers finish together): big tiles of dots."""
    blocks = 1
    for name, v in job.constexprs:
        if name.startswith("B") and isinstance(v, int):
            blocks *= v
    fp32 = any(t == "*fp32" for _, t in job.signature)
    return (-blocks * (2 if fp32 else 1) * job.num_warps,)


def _init_worker() -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    # keep the shared-memory and type checks, silence Triton 3.9's fp-fusion notice
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def compile_all(jobs: list[Launch], workers: int = 2,
                progress=lambda done, total: None) -> dict[Launch, Result]:
    """Every job compiled once; results by job."""
    order = sorted(set(jobs), key=_cost)
    results: dict[Launch, Result] = {}
    if workers <= 1:
        _init_worker()
        for i, job in enumerate(order):
            results[job] = compile_one(job)
            progress(i + 1, len(order))
        return results
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"),
                             initializer=_init_worker) as pool:
        futures = {pool.submit(compile_one, job): job for job in order}
        for i, f in enumerate(futures):
            results[futures[f]] = f.result()
            progress(i + 1, len(order))
    return results


"""Compile captured launches for their GPU target, without a GPU.

Triton's own stages run for the target: the front end (a mixed-dtype tl.dot fails here,
as on the GPU), TTIR, TTGIR, and the TTGIR -> LLVM-dialect passes, which allocate shared
memory: `ttg.shared` is the `metadata.shared` a GPU launch checks against the device's
per-block limit (triton/compiler/compiler.py, CompiledKernel._init_handles). What
follows it (LLVM's O3, PTX, ptxas) changes neither, and is ~90 % of a compile's CPU:
a `shared` compile stops there. A `cubin` compile runs everything, ptxas included (the
gate's ptxas pass on a subset, Plan.ptxas_targets: ptxas errors show only there; it
cannot run out of registers, as Triton's PTX declares the block's thread count).

Each distinct compile (kernel, argument types, constexprs, warps, stages, cc, depth)
runs once, in a pool of processes, longest-looking first; with a cache folder, its
result is kept there under the kernel's source hash, for the next run.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import resource
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from types import ModuleType

import triton
from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia import compiler as nv_compiler
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend

from ckptd.tools.gate.capture import Launch

SHARED, CUBIN = "shared", "cubin"       # how far a compile goes


@dataclass(frozen=True)
class Result:
    shared: int | None          # bytes of shared memory per block; None when it failed
    error: str | None
    cpu_s: float                # this compile's CPU seconds, ptxas included
    depth: str = SHARED


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class _Lowered(Exception):
    """Raised where the TTGIR -> LLVM passes have allocated shared memory."""


class _UpToSharedMemory:
    """A pass namespace of the nvidia backend (its `passes`, `nvidia`) in which the
    llir stage's pipeline ends at the shared-memory allocation: an add_* call after
    add_allocate_shared_memory_nv adds nothing. So the stage runs Triton's own passes up
    to it (whatever they are in this Triton) and none of the lowering to LLVM after it."""

    def __init__(self, namespace, state: dict) -> None:
        self._namespace, self._state = namespace, state

    def __getattr__(self, name: str):
        value = getattr(self._namespace, name)
        if isinstance(value, ModuleType):
            return _UpToSharedMemory(value, self._state)
        if not name.startswith("add_"):
            return value

        def add(*args, **kwargs):
            if self._state["allocated"]:
                return None
            self._state["allocated"] = name == "add_allocate_shared_memory_nv"
            return value(*args, **kwargs)
        return add


class _StopAtLLVM:
    """The backend's `llvm`: its to_module (the first step after the pass pipeline)
    stops the stage, the module's `ttg.shared` set."""

    def __init__(self, llvm) -> None:
        self._llvm = llvm

    def __getattr__(self, name: str):
        if name == "to_module":
            raise _Lowered
        return getattr(self._llvm, name)


@contextmanager
def _up_to_shared_memory():
    """Within: the nvidia backend's llir stage allocates shared memory and stops."""
    state = {"allocated": False}
    saved = nv_compiler.passes, nv_compiler.nvidia, nv_compiler.llvm
    nv_compiler.passes = _UpToSharedMemory(saved[0], state)
    nv_compiler.nvidia = _UpToSharedMemory(saved[1], state)
    nv_compiler.llvm = _StopAtLLVM(saved[2])
    try:
        yield state
    finally:
        nv_compiler.passes, nv_compiler.nvidia, nv_compiler.llvm = saved


def _kernel(job: Launch):
    fn = getattr(importlib.import_module(job.module), job.name)
    while not hasattr(fn, "params"):        # an autotuned / heuristics kernel's JIT function
        fn = fn.fn
    return fn


def _lower(job: Launch, depth: str) -> int:
    """Triton's stages for the job's target, up to the shared memory (SHARED) or the
    cubin (CUBIN): triton.compile's steps, with no cache and no stage after `depth`."""
    fn = _kernel(job)
    signature = dict(job.signature)
    signature.update({name: "constexpr" for name, _ in job.constexprs})
    signature = {p.name: signature[p.name] for p in fn.params}
    src = ASTSource(fn=fn, signature=signature, constexprs=dict(job.constexprs))
    target = GPUTarget("cuda", job.cc, 32)
    backend = make_backend(target)
    options = backend.parse_options({"num_warps": job.num_warps,
                                     "num_stages": job.num_stages})
    stages: dict = {}
    backend.add_stages(stages, options, src.language)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, options, backend.get_codegen_implementation(options),
                         backend.get_module_map(), context)
    metadata = {"target": target, **options.__dict__}
    for ext, stage in stages.items():
        if depth == SHARED and ext == "llir":
            try:
                with _up_to_shared_memory() as state:
                    stage(module, metadata)
            except _Lowered:
                pass
            if not state["allocated"]:
                raise RuntimeError("this Triton's llir stage allocated no shared memory "
                                   "(the gate knows Triton 3.x's nvidia backend)")
            # set on the module by the allocation (make_llir copies it to metadata.shared)
            return int(module.get_int_attr("ttg.shared") or 0)
        module = stage(module, metadata)
    return int(metadata["shared"])


def compile_one(job: Launch, depth: str = SHARED) -> Result:

    t0 = _cpu()
    try:
        shared = _lower(job, depth)
    except Exception as e:  # noqa: BLE001 - a compile error is the gate's finding
        first = str(e).strip().splitlines()
        return Result(None, f"{type(e).__name__}: {' / '.join(first[-3:])[:400]}",
                      _cpu() - t0, depth)
    return Result(shared, None, _cpu() - t0, depth)


def _key(job: Launch, depth: str) -> str:
    """The job under its kernel's source (with what it calls) and the compiler's version."""
    text = json.dumps([_kernel(job).cache_key, triton.__version__, depth, job.module,
                       job.name, job.signature, job.constexprs, job.num_warps,
                       job.num_stages, job.cc], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _cached(job: Launch, depth: str, cache: str | None) -> Result:
    if cache is None:
        return compile_one(job, depth)
    path = Path(cache) / f"{_key(job, depth)}.json"
    if path.exists():
        return Result(**{**json.loads(path.read_text()), "cpu_s": 0.0})
    r = compile_one(job, depth)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(r)))
    tmp.replace(path)
    return r


def size(job: Launch) -> int:
    """How big a compile looks: its blocks' product (the B* constexprs) times its warps."""
    blocks = 1
    for name, v in job.constexprs:
        if name.startswith("B") and isinstance(v, int) and not isinstance(v, bool):
            blocks *= v
    return blocks * job.num_warps


def _cost(item: tuple[Launch, str]) -> tuple:
    """Heavier compiles first (so two workers finish together): ptxas, big tiles of dots."""
    job, depth = item
    fp32 = any(t == "*fp32" for _, t in job.signature)
    return depth != CUBIN, -size(job) * (2 if fp32 else 1), str(job)


def _init_worker() -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    # keep the shared-memory and type checks, silence Triton 3.9's fp-fusion notice
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def compile_all(jobs: list[Launch], workers: int = 2,
                progress=lambda done, total: None, depth=lambda job: SHARED,
                cache: str | None = None) -> dict[Launch, Result]:
    """Every job compiled once, to depth(job); results by job. Workers are forked from
    this process (its imports done once), which has compiled nothing yet."""
    order = sorted({(job, depth(job)) for job in jobs}, key=_cost)
    if cache is not None:
        os.makedirs(cache, exist_ok=True)
    results: dict[Launch, Result] = {}
    if workers <= 1 or len(order) <= 1:
        _init_worker()
        for i, (job, d) in enumerate(order):
            results[job] = _cached(job, d, cache)
            progress(i + 1, len(order))
        return results
    with ProcessPoolExecutor(workers, mp_context=get_context("fork"),
                             initializer=_init_worker) as pool:
        futures = {pool.submit(_cached, job, d, cache): job for job, d in order}
        for i, f in enumerate(futures):
            results[futures[f]] = f.result()
            progress(i + 1, len(order))
    return results

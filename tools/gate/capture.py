"""Every Triton launch the CUDA dispatch makes, recorded without a GPU.

The models of models.py run their forward on the meta device (no memory, no compute)
with every op routed to its Triton launcher, once per target of kernels/launch.py: the
launchers pick block sizes, warps and stages as on that GPU, allocate (meta) outputs,
and call `kernel[grid](...)`, which is intercepted here and recorded as the compile it
would cause: the kernel, its argument types (pointer dtypes, ints), its constexprs and
its options. So the gate compiles exactly what the dispatch launches, at the real
models' shapes, with the dtypes the model really passes (q and k of the delta rule in
fp32, say, beside bf16 values).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from triton.runtime import autotuner, interpreter, jit

from ckptd.kernels import dispatch, launch

DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
          torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
          torch.uint8: "u8", torch.bool: "i1", torch.float64: "fp64"}
# Triton's defaults on CUDA for a launch that names none
DEFAULT_OPTIONS = {"num_warps": 4, "num_stages": 3}


@dataclass(frozen=True)
class Launch:
    """One compile a launch causes: kernel (module, name), its non-constexpr arguments'
    Triton types, its constexprs, num_warps, num_stages, and the target's cc."""
    module: str
    name: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, object], ...]
    num_warps: int
    num_stages: int
    cc: int
    # an autotune candidate: the launch's other constexprs (the candidates' group); the
    # autotuner drops a candidate that does not fit, so one of the group must
    tuned: tuple = ()

    @property
    def kernel(self) -> str:
        return f"{self.module.rsplit('.', 1)[-1]}.{self.name}"


def triton_type(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for a {type(value).__name__} argument")


def _record(fn, args, kwargs, cc: int, tuned_keys: frozenset | None) -> Launch:
    params = fn.params
    values = dict(zip([p.name for p in params], args))
    values.update({k: v for k, v in kwargs.items() if k in {p.name for p in params}})
    devices = {str(v.device) for v in values.values() if isinstance(v, torch.Tensor)}
    if len(devices) > 1:
        raise ValueError(f"{fn.fn.__name__} launched with tensors on {sorted(devices)}: "
                         "every operand of a kernel must be on one device")
    options = {**DEFAULT_OPTIONS, **{k: kwargs[k] for k in DEFAULT_OPTIONS if k in kwargs}}
    signature, constexprs = [], []
    for p in params:
        v = values.get(p.name, p.default if p.has_default else None)
        if p.is_constexpr or v is None:
            constexprs.append((p.name, v))
        else:
            signature.append((p.name, triton_type(v)))
    group = () if tuned_keys is None else \
        tuple((k, v) for k, v in constexprs if k not in tuned_keys)
    return Launch(fn.fn.__module__, fn.fn.__name__, tuple(signature), tuple(constexprs),
                  int(options["num_warps"]), int(options["num_stages"]), cc, group)


@contextmanager
def recording(cc: int) -> Iterator[list[Launch]]:
    """Within: `kernel[grid](...)` records its compile instead of launching."""

    seen: list[Launch] = []
    tuning: list[frozenset] = []        # the keys an autotune config sets, while in one

    def run(self, *args, grid, warmup, **kwargs):
        seen.append(_record(self, args, kwargs, cc, tuning[-1] if tuning else None))

    def tuned(self, *args, **kwargs):
        # every candidate of an autotuned kernel is a compile a GPU may pick
        for config in self.configs:
            tuning.append(frozenset(config.all_kwargs()))
            try:
                merged = {"grid": None, "warmup": False, **kwargs, **config.all_kwargs()}
                self.fn.run(*args, **merged)
            finally:
                tuning.pop()

    def interpreted(self, *args, grid, warmup, **kwargs):
        # under TRITON_INTERPRET=1 (the CPU's test runs) a kernel is an InterpretedFunction:
        # recorded as the JIT function the compiler builds from the same Python function
        run(jit.JITFunction(self.fn), *args, grid=grid, warmup=warmup, **kwargs)

    saved = jit.JITFunction.run, autotuner.Autotuner.run, interpreter.InterpretedFunction.run
    jit.JITFunction.run, autotuner.Autotuner.run = run, tuned
    interpreter.InterpretedFunction.run = interpreted
    try:
        yield seen
    finally:
        (jit.JITFunction.run, autotuner.Autotuner.run,
         interpreter.InterpretedFunction.run) = saved


@contextmanager
def triton_dispatch(external: bool = False) -> Iterator[None]:
    """Every op of kernels/dispatch.py takes its Triton launcher (as on CUDA); with
    `external`, prefill's gated delta rule takes fla's (kernels/external/fla.py, where
    fla-core is installed), else the optional kernels are left out."""

    saved = dispatch.use_triton, dispatch.use_external
    dispatch.use_triton = lambda x: True
    dispatch.use_external = lambda name, x: external and name == "fla"
    try:
        yield
    finally:
        dispatch.use_triton, dispatch.use_external = saved


def capture(run: Callable[[], None], t: launch.Target, external: bool = False
            ) -> list[Launch]:
    """The launches `run` makes on target t (its tensors on the meta device)."""
    with triton_dispatch(external), launch.forced(t), recording(t.cc) as seen:
        run()
    return seen

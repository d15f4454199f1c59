"""The compile gate: every Triton kernel of kernels/, compiled for sm_80, sm_86, sm_89 and
sm_90 with exactly the launches the CUDA dispatch makes for every supported model, in
bf16, fp16 and fp32 and with weights kept in each GGUF format; each compile must succeed
and fit its target's shared memory per block.

    python -m ckptd.tools.gate [--workers 2] [--json out.json] [--markdown]

capture.py records the launches (the models' forward on the meta device, per target),
compile.py compiles each distinct one once (a pool of processes) as far as its shared
memory (and one launch of each kernel through ptxas, on Plan.ptxas), report.py prints
the table docs/BENCHMARKS.md holds. tests/kernels/test_compile_gate.py runs it in CI.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from ckptd.kernels.launch import GATE_TARGETS, SHARED_LIMIT, Target
from ckptd.kernels.quant.formats import FORMATS
from ckptd.tools.gate.capture import capture
from ckptd.tools.gate.compile import CUBIN, SHARED, compile_all, size
from ckptd.tools.gate.models import KEPT_MODELS, MODELS
from ckptd.tools.gate.steps import meta_model, run_all

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Plan:
    """What to run: models (names of models.MODELS) in dtypes; KEPT_MODELS with each
    of `formats` in `kept_dtypes`; on `targets`."""
    models: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = tuple(DTYPES)
    formats: tuple[str, ...] = tuple(FORMATS)
    kept_dtypes: tuple[str, ...] = tuple(DTYPES)
    targets: tuple[Target, ...] = GATE_TARGETS
    external: bool = False      # fla's kernels through kernels/external/fla.py too
    # targets on which one launch of each kernel is compiled through ptxas (the rest stop
    # where shared memory is known: compile.py)
    ptxas: tuple[int, ...] = (90,)

    def __post_init__(self) -> None:
        self.models = self.models or tuple(MODELS)


@dataclass
class Gate:
    """Each distinct compile, who launches it (model, dtype label, step), its result."""
    uses: dict = field(default_factory=lambda: defaultdict(set))
    results: dict = field(default_factory=dict)

    def failures(self) -> list[tuple]:
        """(launch, why) for every compile that failed or needs more shared memory
        than its target has; of an autotuned launch's candidates (external kernels),
        one that does not fit is dropped by the autotuner, so only a group with none
        that fits fails."""
        fits = {_group(j) for j, r in self.results.items() if j.tuned and r.error is None
                and r.shared <= SHARED_LIMIT[j.cc]}
        bad = []
        for job, r in self.results.items():
            if r.error is not None:
                bad.append((job, r.error))
            elif r.shared > SHARED_LIMIT[job.cc] and not (job.tuned and _group(job) in fits):
                bad.append((job, f"needs {r.shared:,} B of shared memory, sm_{job.cc} has "
                                 f"{SHARED_LIMIT[job.cc]:,} B per block"))
        return bad


def _group(job) -> tuple:
    return job.module, job.name, job.signature, job.tuned, job.cc


def _cases(plan: Plan) -> Iterable[tuple[str, str, str | None, torch.dtype]]:
    """(model, dtype label, kept format or None, dtype)."""
    for name in plan.models:
        for label in plan.dtypes:
            yield name, label, None, DTYPES[label]
    for name in (m for m in plan.models if m in KEPT_MODELS):
        for fmt in plan.formats:
            for label in plan.kept_dtypes:
                yield name, f"{label}.{fmt}", fmt, DTYPES[label]


def collect(plan: Plan, gate: Gate | None = None) -> Gate:
    """Capture every launch of the plan (no compile yet)."""

    gate = gate or Gate()
    for name, label, fmt, dtype in _cases(plan):
        model = meta_model(MODELS[name], dtype, fmt)
        for t in plan.targets:
            for job in capture(lambda: run_all(model), t, plan.external):  # noqa: B023
                gate.uses[job].add((name, label))
    return gate


def through_ptxas(gate: Gate, targets: tuple[int, ...]) -> set:
    """One launch of each kernel per target of `targets` to compile through ptxas: of
    those bf16 runs make (else any), the one of smallest blocks (ptxas's failures are
    the compiler's, not the shape's; its time grows with the blocks)."""
    chosen: dict[tuple, object] = {}
    for job in sorted(gate.uses, key=lambda j: (size(j), str(j))):
        if job.cc in targets:
            bf16 = any(label.split(".")[0] == "bf16" for _, label in gate.uses[job])
            key = job.module, job.name, job.cc
            if key not in chosen or (bf16 and not chosen[key][0]):
                chosen[key] = (bf16, job)
    return {job for _, job in chosen.values()}


def compile_gate(gate: Gate, plan: Plan, workers: int = 2,
                 progress=lambda done, total: None, cache: str | None = None) -> Gate:
    """Compile the captured launches: each to its shared memory, some through ptxas."""
    full = through_ptxas(gate, plan.ptxas)
    gate.results = compile_all(list(gate.uses), workers, progress,
                               lambda job: CUBIN if job in full else SHARED, cache)
    return gate


def run(plan: Plan, workers: int = 2, progress=lambda done, total: None) -> Gate:

    return compile_gate(collect(plan), plan, workers, progress)

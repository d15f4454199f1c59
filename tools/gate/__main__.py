"""python -m ckptd.tools.gate: compile every kernel launch for sm_80/86/89/90; exit 1 if
one fails or needs more shared memory than its target has."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ckptd.kernels.launch import GATE_TARGETS
from ckptd.kernels.quant.formats import FORMATS
from ckptd.tools import gate as gate_mod
from ckptd.tools.gate import DTYPES, Plan
from ckptd.tools.gate.compile import CUBIN
from ckptd.tools.gate.models import MODELS
from ckptd.tools.gate.report import markdown, rows


def _args(argv):

    p = argparse.ArgumentParser(prog="python -m ckptd.tools.gate", description=__doc__)
    p.add_argument("--workers", type=int, default=2, help="compiling processes (default 2)")
    p.add_argument("--models", default=",".join(MODELS), help="models.py names, comma-separated")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="bf16,fp16,fp32")
    p.add_argument("--formats", default=",".join(FORMATS), help="kept GGUF formats")
    p.add_argument("--kept-dtypes", default=",".join(DTYPES), help="dtypes of the kept runs")
    p.add_argument("--external", action="store_true",
                   help="also fla's kernels through kernels/external/fla.py (fla-core "
                        "installed; every autotune candidate)")
    p.add_argument("--targets", default="80,86,89,90", help="compute capabilities")
    p.add_argument("--kernels", default="",
                   help="compile only kernels whose module.name contains one of these "
                        "(comma-separated; default: all)")
    p.add_argument("--ptxas", default="90",
                   help="targets on which one launch of each kernel is compiled through "
                        "ptxas (comma-separated; '' for none; the rest stop where shared "
                        "memory is known)")
    p.add_argument("--cache-dir", help="keep each compile's result here, for the next run "
                                       "(default: none, every compile runs)")
    p.add_argument("--json", help="write the rows and timings here")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = _args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("the gate compiles for GPUs: run it without TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    split = lambda s: tuple(x for x in s.split(",") if x)  # noqa: E731
    targets = tuple(t for t in GATE_TARGETS if str(t.cc) in split(a.targets))
    plan = Plan(models=split(a.models), dtypes=split(a.dtypes), formats=split(a.formats),
                kept_dtypes=split(a.kept_dtypes), targets=targets, external=a.external,
                ptxas=tuple(int(cc) for cc in split(a.ptxas)))
    t0, c0 = time.perf_counter(), time.process_time()
    gate = gate_mod.collect(plan)
    if a.kernels:
        gate.uses = {j: u for j, u in gate.uses.items()
                     if any(k in j.kernel for k in split(a.kernels))}
    t1, c1 = time.perf_counter(), time.process_time()

    def progress(done, total):
        if done % 25 == 0 or done == total:
            print(f"  compiled {done}/{total} ({time.perf_counter() - t1:.0f} s)",
                  file=sys.stderr, flush=True)

    gate_mod.compile_gate(gate, plan, a.workers, progress, a.cache_dir)
    t2 = time.perf_counter()
    cpu = sum(r.cpu_s for r in gate.results.values())
    ptxas = sum(r.depth == CUBIN for r in gate.results.values())
    failures = gate.failures()
    summary = (f"{len(gate.results)} compiles ({ptxas} through ptxas; {len(rows(gate))} "
               f"launch forms) in {t2 - t1:.0f} s on {a.workers} process(es), {cpu:.0f} "
               f"CPU-s; launches captured in {t1 - t0:.0f} s, {c1 - c0:.0f} CPU-s; "
               f"{len(failures)} failed")
    print(markdown(gate) if a.markdown else "")
    print(summary)
    for job, why in failures:
        print(f"FAILED {job.kernel} sm_{job.cc} {dict(job.constexprs)}: {why}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary, "capture_s": t1 - t0, "capture_cpu_s": c1 - c0,
                       "compile_s": t2 - t1, "cpu_s": cpu, "ptxas": ptxas,
                       "workers": a.workers, "rows": rows(gate),
                       "failures": [[j.kernel, j.cc, why] for j, why in failures]},
                      f, indent=1, default=str)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

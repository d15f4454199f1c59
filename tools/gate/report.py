"""The gate's table: one row per kernel launch form (kernel, its block sizes and dtypes),
the models and dtypes that launch it, and its shared memory on each target."""

from __future__ import annotations

from collections import defaultdict

from ckptd.kernels.launch import SHARED_LIMIT
from ckptd.tools.gate.capture import Launch

# constexprs that only say which input a launch reads (shown as the kernel's variant)
_FLAGS = ("SWIGLU", "KEPT", "HAS_BIAS", "GATED", "HAS_OFFSET", "SRC_INDEXED", "DST_INDEXED")
_CCS = sorted(SHARED_LIMIT)


def _form(job: Launch) -> tuple:
    return job.module, job.name, job.signature, job.constexprs, job.num_warps, job.num_stages


def _dtypes(job: Launch) -> str:
    """The distinct pointer dtypes of the launch, in argument order."""
    seen: list[str] = []
    for _, t in job.signature:
        if t.startswith("*") and t[1:] not in seen:
            seen.append(t[1:])
    return "/".join(seen)


def _blocks(job: Launch) -> str:
    shown = []
    for name, v in job.constexprs:
        if name in _FLAGS and v:
            shown.append(name.lower())
        elif name.startswith(("B", "D", "K", "V")) and v not in (None, False, True):
            shown.append(f"{name}={v}")
    return " ".join(shown + [f"w{job.num_warps}s{job.num_stages}"])


def rows(gate) -> list[dict]:
    """One dict per launch form: kernel, launch, dtypes, models, shared by cc, status."""
    forms: dict[tuple, dict] = defaultdict(dict)
    for job in gate.uses:
        forms[_form(job)][job.cc] = job
    failed = {job for job, _ in gate.failures()}
    out = []
    for _, by_cc in sorted(forms.items(), key=lambda kv: (kv[0][1], str(kv[0][3]))):
        any_job = next(iter(by_cc.values()))
        users = set().union(*(gate.uses[j] for j in by_cc.values()))
        results = {cc: gate.results.get(j) for cc, j in by_cc.items()}
        bad = [cc for cc, j in by_cc.items() if j in failed]
        out.append({
            "kernel": any_job.kernel, "launch": _blocks(any_job), "dtypes": _dtypes(any_job),
            "models": sorted({m for m, _ in users}), "labels": sorted({d for _, d in users}),
            "shared": {cc: (r.shared if r is not None else None) for cc, r in results.items()},
            "errors": {cc: r.error for cc, r in results.items() if r is not None and r.error},
            "cpu_s": round(sum(r.cpu_s for r in results.values() if r is not None), 2),
            "ok": not bad})
    return out


def markdown(gate) -> str:
    lines = ["| kernel | launch | dtypes (args) | run by (dtype) | "
             + " | ".join(f"sm_{cc}" for cc in _CCS) + " |",
             "|---|---|---|---|" + "---:|" * len(_CCS)]
    for r in rows(gate):
        forms: dict[int, str] = {}
        for cc in _CCS:
            s = r["shared"].get(cc)
            cell = "-" if cc not in r["shared"] else (
                "ERROR" if cc in r["errors"] else f"{s:,}")
            if s is not None and s > SHARED_LIMIT[cc]:
                cell = f"**{s:,} > limit**"
            forms[cc] = cell
        labels = ", ".join(r["labels"]) if len(r["labels"]) <= 4 else \
            f"{len(r['labels'])} dtype/format cases"
        lines.append(f"| {r['kernel']} | {r['launch']} | {r['dtypes']} | {labels} | "
                     + " | ".join(forms[cc] for cc in _CCS) + " |")
    return "\n".join(lines)

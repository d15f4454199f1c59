"""Markdown tables of tools/gpu_check.sh's JSON results, for docs/BENCHMARKS.md.

    python -m ckptd.tools.bench.gpu_report FILE.json...    (each one's kind by its name)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def kernels(d: dict) -> str:
    rows = ["| op | impl | ms | TFLOP/s | GB/s | of peak |", "|---|---|---:|---:|---:|---:|"]
    for r in d["rows"]:
        if "error" in r:
            rows.append(f"| {r['op']} | {r['impl']} | failed: {r['error'][:60]} | | | |")
        else:
            rows.append(f"| {r['op']} | {r['impl']} | {r['ms']:.3f} | {r['tflops']:.1f} | "
                        f"{r['gbps']:.0f} | {100 * r['fraction_of_peak']:.0f}% |")
    return f"Kernels ({d['device']}, {d['dtype']}, sizes {d['sizes']}):\n\n" + "\n".join(rows)


def decode(rows: list) -> str:
    out = ["| model | batch | graphs | ms / step | tokens/s |", "|---|---:|---|---:|---:|"]
    out += [f"| {r['model']} ({r['device']}, context {r['context']}) | {r['batch']} | "
            f"{'yes' if r['graphs'] else 'no'} | {r['ms_per_step']} | {r['tokens_per_s']} |"
            for r in rows]
    return "Decode steps, CUDA graphs vs eager:\n\n" + "\n".join(out)


def e2e(d: dict) -> str:
    out = ["| phase | cached tokens | prompt ms | wall ms |", "|---|---:|---:|---:|"]
    for k in ("uncached", "cold", "warm", "branch", "after_sigkill"):
        r = d.get(k)
        if r:
            out.append(f"| {k} | {r['cached']} | {r['ttft_ms']} | {r['wall_ms']} |")
    head = (f"Daemon end to end: {d['model']} on {d['device']} {d['dtype']}, "
            f"{d['context_chars']} characters of context; cached == uncached: "
            f"{d.get('cached_equals_uncached')}; ok: {d.get('ok')}")
    return head + "\n\n" + "\n".join(out)


def big_state(d: dict) -> str:
    keys = ("tokens", "device", "logical_bytes", "stored_bytes", "restore_s", "restore_mb_s",
            "plain_read_s", "plain_read_mb_s", "restore_vs_plain", "page_cache_dropped",
            "pinned")
    return "Disk restore of a 35B-A3B-shaped context:\n\n" + "\n".join(
        f"- {k}: {d.get(k)}" for k in keys)


def _figures(r: dict) -> list[str]:
    """One phase's row: a request's TTFT and tokens, or a batch's, or a load's."""
    if "ttft_s" in r:
        return [f"{r['ttft_s']:,.3f}", f"{r.get('prompt_n') or ''}", f"{r.get('cache_n', '')}",
                f"{r.get('computed_n', '')}", f"{r.get('tier') or ''}",
                f"{r.get('decode_tps', '')}"]
    if "batch" in r and "decode_tps" in r:
        return [f"{r['ttft_s_max']:,.3f} (max)", "", "", "", "", f"{r['decode_tps']}"]
    return [""] * 6


def full_size(d: dict) -> str:
    gib = 2 ** 30
    out = [f"The full-size model served ({d['model']}, {d['file_bytes'] / gib:.2f} GiB, "
           f"--device {d['device']} {' '.join(d['serve_args'])}):", "",
           "| phase | status | TTFT s | prompt | cached | computed | tier | decode tok/s "
           "| s |", "|---|---|---:|---:|---:|---:|---|---:|---:|"]
    for r in d["phases"]:
        cells = _figures(r)
        if r["status"] != "ok":
            cells = [r.get("error", "")[:120], *[""] * 5]
        extra = ", ".join(f"{k} {r[k]}" for k in ("load_s", "drain_s") if k in r)
        out.append(f"| {r['phase']}{f' ({extra})' if extra else ''} | {r['status']} | "
                   + " | ".join(cells) + f" | {r.get('seconds', '')} |")
    out += ["", "| during | GPU memory used, peak GiB | daemon RSS, peak GiB |", "|---|---:|---:|"]
    for phase, p in d.get("peaks", {}).items():
        dev = f"{p['device_used'] / gib:.2f}" if "device_used" in p else "–"
        rss = f"{p['rss_peak'] / gib:.2f}" if "rss_peak" in p else "–"
        out.append(f"| {phase} | {dev} | {rss} |")
    if d.get("cut"):
        out.append(f"\nCut: {d['cut']}.")
    return "\n".join(out) + f"\n\nThe daemon's part took {d.get('took_s', '?')} s."


def render(path: Path) -> str:
    d = json.loads(path.read_text())
    name = path.stem
    for prefix, fn in (("kernels", kernels), ("decode", decode), ("e2e", e2e),
                       ("big_state", big_state), ("full_size", full_size)):
        if name.startswith(prefix):
            return fn(d)
    return f"{name}:\n\n```\n{json.dumps(d, indent=1)[:4000]}\n```"


def main(argv: list[str] | None = None) -> int:
    for f in (argv if argv is not None else sys.argv[1:]):
        p = Path(f)
        print(render(p) if p.exists() else f"({p.name}: not written)")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

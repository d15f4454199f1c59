"""Registers, spills and shared memory of the kept decode GEMV (kernels/quant/gemv.py) per
GPU target, without a GPU: each launch compiled by `triton.compile` for sm_80/86/89/90
with the 16-byte divisibility a real launch specializes (its pointers, row strides), then
its PTX through the Triton wheel's ptxas -v (the compile gate, tools/gate, stops at the
shared memory and does not print these).

    python -m ckptd.tools.bench.kernels_regs            # a table, one line per launch
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

# the compiler, not the interpreter: set before triton loads
os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ckptd.kernels.launch import GATE_TARGETS  # noqa: E402
from ckptd.kernels.quant.gemv import _gemv_kernel  # noqa: E402

_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
_POINTERS = {"x": "*bf16", "w": "*u8", "w2": "*u8", "y": "*fp32", "bias": "*fp32",
             "ids": "*i32", "weights": "*fp32"}
_INTS = ("M", "N", "K", "row_bytes", "row_bytes2", "stride_we", "stride_we2", "stride_xm",
         "stride_ys", "stride_ym", "steps_per", "top_k")
_ALIGNED = ("x", "w", "w2", "y", "row_bytes", "row_bytes2", "stride_xm")
# (label, FMT, FMT2, rows, EXPERTS, SWIGLU): the 35B-A3B's decode launches
LAUNCHES = (("Q4_K, 1 row", 12, 12, 1, False, False), ("Q4_K, 8 rows", 12, 12, 8, False, False),
            ("Q6_K, 1 row", 14, 14, 1, False, False), ("Q8_0, 1 row", 8, 8, 1, False, False),
            ("experts, Q4_K gate + up, SwiGLU", 12, 12, 1, True, True),
            ("experts, Q6_K down", 14, 14, 1, True, False))


def _ptxas() -> str:
    # Triton's PTX is for the newest ptxas of the wheel (PTX ISA 9.x)
    newest = os.path.join(_BIN, "ptxas-blackwell")
    return newest if os.path.exists(newest) else os.path.join(_BIN, "ptxas")


def measure(cc: int, fmt: int, fmt2: int, rows: int, experts: bool, swiglu: bool):
    """(registers, spill store bytes, shared bytes) of one launch on sm_<cc>."""
    constexprs = {"FMT": fmt, "FMT2": fmt2, "EVEN": True, "EXPERTS": experts,
                  "SWIGLU": swiglu, "HAS_BIAS": False, "ALIGNED": True, "BM": rows, "BN": 16}
    signature = {**_POINTERS, **{n: "i32" for n in _INTS},
                 **{n: "constexpr" for n in constexprs}}
    names = list(signature)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in _ALIGNED}
    ck = triton.compile(ASTSource(fn=_gemv_kernel, signature=signature, constexprs=constexprs,
                                  attrs=attrs),
                        target=GPUTarget("cuda", cc, 32), options={"num_warps": 4,
                                                                   "num_stages": 2})
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(ck.asm["ptx"])
        arch = f"sm_{cc}a" if cc == 90 else f"sm_{cc}"
        out = subprocess.run([_ptxas(), "-v", f"--gpu-name={arch}", ptx, "-o",
                              os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
    regs = re.search(r"Used (\d+) registers", out.stderr)
    spills = re.search(r"(\d+) bytes spill stores", out.stderr)
    if regs is None:
        raise RuntimeError(f"ptxas on sm_{cc}: {out.stderr[-500:]}")
    return int(regs.group(1)), int(spills.group(1)) if spills else 0, ck.metadata.shared


def main() -> int:
    ccs = [t.cc for t in GATE_TARGETS]
    print("| launch (bf16 activations) | " + " | ".join(f"sm_{cc} regs/spill B" for cc in ccs)
          + " | shared B |")
    print("|---|" + "---:|" * (len(ccs) + 1))
    for label, *launch in LAUNCHES:
        found = [measure(cc, *launch) for cc in ccs]
        cells = " | ".join(f"{r} / {s}" for r, s, _ in found)
        print(f"| {label} | {cells} | {found[-1][2]:,} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The compile gate (tools/gate): every Triton kernel compiled for sm_80, sm_86, sm_89 and
sm_90 with the launches the CUDA dispatch makes for every supported model, in bf16, fp16,
fp32 and each kept GGUF format; each must compile and fit its target's shared memory.

It runs as its own process: the kernel tests interpret Triton (TRITON_INTERPRET=1), and
the gate needs the compiler. ptxas comes in the triton wheel, so no GPU is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from importlib.util import find_spec

import pytest

from ckptd.kernels.launch import SHARED_LIMIT
from ckptd.kernels.quant.formats import FORMATS
from ckptd.tools.gate import DTYPES
from ckptd.tools.gate.models import KEPT_MODELS, MODELS
from tests.kernels.kernel_index import all_kernels


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "CKPTD_KERNELS")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(args: list[str], timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=_env(), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    """One Triton cache for the module's gate runs: a compile runs once."""
    return str(tmp_path_factory.mktemp("triton-cache"))


def _gate(cache: str, out, *args: str) -> dict:
    r = _run(["-m", "ckptd.tools.gate", "--workers", "2", "--cache-dir", cache,
              "--json", str(out), *args], 3000)
    print(r.stdout[-3000:], r.stderr[-3000:])
    assert r.returncode in (0, 1), r.stderr[-3000:]
    return json.loads(out.read_text())


# CI's plan is the whole plan: every model of models.py in bf16, fp16 and fp32, the 35B-A3B
# with each kept GGUF format in each, on all four targets (~440 compiles, each as far as
# its shared memory, one launch of each kernel through ptxas on sm_90; ~2 minutes on two
# cores, BENCHMARKS.md).
@pytest.fixture(scope="module")
def gate(tmp_path_factory, cache) -> dict:
    return _gate(cache, tmp_path_factory.mktemp("gate") / "gate.json")


def test_every_launch_compiles_and_fits(gate):
    assert gate["failures"] == [], "\n".join(map(str, gate["failures"]))
    # every kernel each dtype / format launches is compiled for every target (a launch
    # form may be one target's: fp32 attention at head dim 256 on sm_86/89's blocks)
    targets = defaultdict(set)
    for row in gate["rows"]:
        assert row["ok"], row
        for label in row["labels"]:
            targets[row["kernel"], label] |= {int(cc) for cc in row["shared"]}
    assert targets and all(ccs == set(SHARED_LIMIT) for ccs in targets.values()), targets


def test_every_kernel_model_dtype_and_format_is_covered(gate):
    rows = gate["rows"]
    assert {r["kernel"] for r in rows} == all_kernels()
    assert {m for r in rows for m in r["models"]} == set(MODELS)
    labels = {label for r in rows for label in r["labels"]}
    assert set(DTYPES) <= labels
    assert {f"{d}.{fmt}" for d in DTYPES for fmt in FORMATS} <= labels
    assert "qwen3.5-35b-a3b" in KEPT_MODELS
    # the delta rule's chunked prefill at Qwen3.5's K = V = 128, in every dtype
    gdn = [r for r in rows if r["kernel"] == "chunk_state._state_kernel"]
    assert set(DTYPES) <= {d for r in gdn for d in r["labels"]}
    # one launch of each kernel went through ptxas (on sm_90), the rest stopped at the
    # shared memory
    assert gate["ptxas"] == len(all_kernels()) < len(gate["rows"])


_BAD = """
import json
from ckptd.tools.gate.capture import Launch
from ckptd.tools.gate.compile import CUBIN, compile_one
from ckptd.kernels.launch import SHARED_LIMIT

# fp32 attention at head dim 256 in blocks of 64 keys: ~150 KB, over an RTX 3090's 101 KB
attn = "ckptd.kernels.paged_attention.triton_attention"
sig = {"q": "*fp32", "pool": "*fp32", "o": "*fp32", "part_acc": "*fp32", "part_ml": "*fp32",
       "tables": "*i32", "cu_q": "*i32", "ctx_lens": "*i32", "sinks": "*fp32", "scale": "fp32"}
ints = ["layer", "G", "B", "Hq", "n_split", "split_len", "window", "has_sinks", "stride_qt",
        "stride_qh", "stride_ot", "stride_oh", "stride_tab", "stride_p", "stride_l",
        "stride_kv", "stride_b", "stride_h"]
big = Launch(attn, "_paged_attn_kernel", tuple({**sig, **{n: "i32" for n in ints}}.items()),
             (("D", 256), ("BD", 256), ("BR", 16), ("BN", 64), ("PREC", "ieee")), 4, 3, 86)
# a bf16 operand beside an fp32 one in tl.dot (fla's failure): h in fp32, v_new in bf16
out = "ckptd.kernels.gated_delta.chunk_state"
sig = {"q": "*fp32", "k": "*fp32", "v_new": "*bf16", "h": "*fp32", "gc": "*fp32",
       "o": "*bf16", "chunk_bos": "*i32", "chunk_eos": "*i32", "scale": "fp32", "H": "i32"}
mixed = Launch(out, "_output_kernel", tuple(sig.items()),
               (("K", 128), ("V", 128), ("BT", 64), ("BK", 64), ("BV", 64), ("PREC", "tf32")),
               4, 1, 90)
r1, r2 = compile_one(big), compile_one(mixed)
# the whole compile, ptxas included: the same shared memory as the gate's stop after it
full = compile_one(big, CUBIN)
print(json.dumps({"big": [r1.shared, r1.error, SHARED_LIMIT[86]], "mixed": r2.error,
                  "full": [full.shared, full.error, full.depth]}))
"""


def test_the_gate_finds_too_much_shared_memory_and_mixed_dtypes():
    r = _run(["-c", _BAD], 600)
    assert r.returncode == 0, r.stderr[-3000:]
    found = json.loads(r.stdout.strip().splitlines()[-1])
    shared, error, limit = found["big"]
    assert error is None and shared > limit
    assert found["full"] == [shared, None, "cubin"]
    assert "same dtype" in found["mixed"]


# fla's chunked delta rule through kernels/external/fla.py, as a bf16 prefill of Qwen3.5
# calls it: every autotune candidate compiled (the autotuner drops one that does not fit,
# so one of each launch's candidates must), for sm_90, of the two kernels that take the
# adapter's q, k, v and beta (the whole set, every target: drop --targets and --kernels)
FLA = "ckptd.tools.gate", "--external", "--models", "qwen3.5-35b-a3b", "--dtypes", \
    "bf16", "--formats", "", "--targets", "90", "--ptxas", "", "--kernels", \
    "recompute_w_u_fwd_kernel,chunk_fwd_kernel_o"


@pytest.mark.skipif(not find_spec("fla"), reason="needs fla-core (the test extra)")
def test_fla_through_the_adapter_compiles(tmp_path, cache, gate):
    found = _gate(cache, tmp_path / "fla.json", *FLA[1:])
    assert found["failures"] == [], "\n".join(map(str, found["failures"]))
    fla = {r["kernel"] for r in found["rows"] if r["kernel"].split(".")[0] in
           ("wy_fast", "chunk_delta_h", "chunk_o", "chunk_fwd")}
    assert {"wy_fast.recompute_w_u_fwd_kernel", "chunk_o.chunk_fwd_kernel_o"} <= fla


_FLA_OLD = """
import json
import torch
from ckptd.kernels.external import fla
from ckptd.kernels.launch import GATE_TARGETS
from ckptd.kernels.varlen import device_cu, host_cu
from ckptd.tools.gate import Plan, collect
from ckptd.tools.gate.compile import compile_all

def before_the_fix(q, k, v, g, beta, cu_seqlens, state_pool, state_indices):
    # the adapter as it was: the model's fp32 q, k and an fp32 beta beside bf16 v
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    idx = torch.as_tensor(state_indices, device=q.device).to(torch.int64)
    o, final = chunk_gated_delta_rule(
        q[None], k[None], v[None], g[None].float(), beta[None].float(),
        initial_state=state_pool[idx], output_final_state=True,
        cu_seqlens=device_cu(cu_seqlens, q.device).to(torch.int64),
        cu_seqlens_cpu=torch.tensor(host_cu(cu_seqlens), dtype=torch.int64))
    return o[0].to(v.dtype)

fla.chunk_gated_delta_rule_varlen = before_the_fix
gate = collect(Plan(models=("qwen3.5-35b-a3b",), dtypes=("bf16",), formats=(),
                    targets=GATE_TARGETS[-1:], external=True))
jobs = [j for j in gate.uses if j.module.startswith("fla.") and "recompute_w_u" in j.name]
gate.results = compile_all(jobs, 2)
print(json.dumps(sorted({j.name for j, why in gate.failures() if "same dtype" in why})))
"""


@pytest.mark.skipif(not find_spec("fla"), reason="needs fla-core (the test extra)")
def test_the_gate_finds_the_old_adapters_mixed_dtypes():
    r = _run(["-c", _FLA_OLD], 1800)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]), r.stdout[-3000:]

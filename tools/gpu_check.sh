#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA device: installs what it needs (a CUDA
# torch, triton, ckptd with its test extras, fla-core for the benchmark's
# comparison, each only if missing), runs the whole test suite with the Triton
# kernels compiled for the GPU (the bf16 and large-shape kernel tests run only
# there), then tools/bench/kernels.py. Everything goes to one report file:
# $OUT/gpu-report.txt, or ./gpu-report/gpu-report.txt without $OUT.
# Usage: tools/gpu_check.sh   (PYTHON=... picks the interpreter; PEAK_TFLOPS and
# PEAK_GBPS override the peaks guessed from the device name)
set -uo pipefail
cd "$(dirname "$0")/.."
REPORT_DIR=${OUT:-./gpu-report}
mkdir -p "$REPORT_DIR"
REPORT="$REPORT_DIR/gpu-report.txt"
: > "$REPORT"
log() { echo "$@" | tee -a "$REPORT"; }
section() { log ""; log "== $* =="; }

if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
elif [ -x .venv/bin/python ] && .venv/bin/python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    PY=.venv/bin/python
else
    PY=python3
fi
PIP="$PY -m pip --disable-pip-version-check -q"

section "machine"
{ date -u; uname -a; nvidia-smi || echo "nvidia-smi not found"; } 2>&1 | tee -a "$REPORT"

section "install"
if ! $PY -c "import torch, triton; assert torch.cuda.is_available()" 2>/dev/null; then
    log "no CUDA torch + triton for $PY: installing them"
    $PIP install torch triton 2>&1 | tee -a "$REPORT"
fi
if ! $PY -c "import kernels, lmdb, zstandard, aiohttp, pytest_asyncio, transformers, hypothesis, openai" 2>/dev/null; then
    $PIP install -e ".[test]" 2>&1 | tee -a "$REPORT"
fi
$PY -c "import fla" 2>/dev/null || $PIP install fla-core 2>&1 | tee -a "$REPORT" \
    || log "fla-core not installed: the benchmark runs without it"
$PY - <<'EOF' 2>&1 | tee -a "$REPORT"
import torch, triton
print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)
print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else "NONE")
EOF
if ! $PY -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    log "FAIL: no CUDA device visible to torch; nothing to check"
    exit 1
fi

# compiled kernels: the interpreter must be off; dispatch picks Triton for CUDA tensors
unset TRITON_INTERPRET
export CKPTD_KERNELS=auto

section "test suite"
$PY -m pytest -q -rs --durations=15 tests 2>&1 | tee -a "$REPORT"
tests_rc=${PIPESTATUS[0]}

section "kernel tests, verbose"
$PY -m pytest -q -rA tests/kernels tests/model/test_triton_model.py 2>&1 | tail -n 120 \
    | tee -a "$REPORT"

section "kernel benchmark"
name=$($PY -c "import torch; print(torch.cuda.get_device_name())")
case "$name" in
    *H200*) tflops=989; gbps=4800 ;;
    *H100*PCIe*) tflops=756; gbps=2000 ;;
    *H100*) tflops=989; gbps=3350 ;;
    *A100*) tflops=312; gbps=2039 ;;
    *L40S*) tflops=362; gbps=864 ;;
    *) tflops=0; gbps=0 ;;
esac
tflops=${PEAK_TFLOPS:-$tflops}
gbps=${PEAK_GBPS:-$gbps}
log "peaks used: ${tflops} TFLOP/s (bf16 dense), ${gbps} GB/s"
$PY tools/bench/kernels.py --peak-tflops "$tflops" --peak-gbps "$gbps" 2>&1 | tee -a "$REPORT"
bench_rc=${PIPESTATUS[0]}

section "summary"
log "test suite exit code: $tests_rc; benchmark exit code: $bench_rc"
log "report: $REPORT"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]

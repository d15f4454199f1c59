#!/usr/bin/env bash
# Issue 19's proof on one lent GPU (an H100 or H200 of the device tool), in two calls
# of about 5 minutes each; each writes $OUT/results-N.md, ready for docs/BENCHMARKS.md,
# beside its JSON and its log. The machine reaches no registry, so first, here:
#
#   tools/gpu_prepare.sh          (wheels it lacks + SmolLM2's GGUF, in .gpu/a and .gpu/b)
#
# then, with the device tool, the second call at once after the first (the machine
# stays warm ~30 s, and stage 2 uses what stage 1 installed):
#
#   run(command="tools/gpu_check.sh 1", carry=[".gpu/a"], timeout_s=420)
#   run(command="tools/gpu_check.sh 2", carry=[".gpu/b"], timeout_s=360)
#
# Stage 1: the tests on CUDA (step kernels against the references at head dims
#   64/128/256 in bf16 and fp32, fla where carried, the models on Triton, no host sync in
#   the forward, CUDA graphs == eager, the engine cached == uncached through RAM and disk
#   in bf16 and fp32, decode layers under torch.cuda.set_sync_debug_mode("error"));
#   kernel benchmarks against the torch references and fla (decode attention at 32K);
#   decode steps with graphs and eagerly on the 35B-A3B-shaped model.
# Stage 2: the daemon end to end on CUDA with the tiny hybrid and SmolLM2 (uncached,
#   cold, warm, a branch, SIGKILL + restart: cached answers == uncached); the
#   35B-A3B-shaped engine's time to first token at 32K and 250K tokens, cold, warm and
#   after a restart (disk); a disk restore to the GPU against a plain read.
# Every step has a time limit within the stage's budget, so the results file is written
# even when a step runs long; a failed or cut step is marked FAILED there, exit 1.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGE=${1:-}
case "$STAGE" in 1) BUDGET=${BUDGET:-390} ;; 2) BUDGET=${BUDGET:-330} ;;
    *) echo "usage: tools/gpu_check.sh 1|2 (see the top of this file)" >&2; exit 2 ;; esac
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=/tmp/ckptd-site            # wheels carried in .gpu/a (stage 1 installs them)
SRC=/tmp/ckptd-src              # ckptd importable from this checkout, as an editable install
MODELS=/tmp/ckptd-models
export PYTHONUNBUFFERED=1 PYTHONPATH="$SRC:$SITE${PYTHONPATH:+:$PYTHONPATH}"
RES=$OUT/results-$STAGE.md
LOG=$OUT/log-$STAGE.txt
: >"$RES"
: >"$LOG"
DEADLINE=$((SECONDS + BUDGET))
failed=0

# step NAME CAP_SECONDS CMD...: runs CMD for at most CAP seconds (less if the stage's
# budget runs out), its output to the log, its outcome to the results
step() {
    local name=$1 cap=$2
    shift 2
    local left=$((DEADLINE - SECONDS))
    ((cap > left)) && cap=$left
    if ((cap < 5)); then
        echo "- $name: SKIPPED (the stage's ${BUDGET} s were spent)" >>"$RES"
        failed=1
        return
    fi
    echo "== $name (at most $cap s): $*" >>"$LOG"
    local t0=$SECONDS
    timeout --kill-after=10 "$cap" "$@" >>"$LOG" 2>&1
    local rc=$?
    if ((rc == 0)); then
        echo "- $name: ok ($((SECONDS - t0)) s)" >>"$RES"
    else
        local why="exit $rc"
        ((rc == 124 || rc == 137)) && why="cut at $cap s"
        echo "- $name: FAILED ($why after $((SECONDS - t0)) s; see log-$STAGE.txt)" >>"$RES"
        failed=1
    fi
}

mkdir -p "$SRC/ckptd" "$MODELS"
for d in cache daemon kernels model tools; do ln -sfn "$ROOT/$d" "$SRC/ckptd/$d"; done
if ((STAGE == 1)); then
    if ls .gpu/a/*.whl >/dev/null 2>&1; then
        $PY -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" \
            .gpu/a/*.whl >>"$LOG" 2>&1
    fi
    cp .gpu/a/smollm2.gguf.part00 "$MODELS/" 2>/dev/null
fi
if ! $PY -c "import ckptd.model.runner, ckptd.cache.manager, lmdb, zstandard, gguf" >>"$LOG" 2>&1
then
    echo "setup failed: ckptd or its dependencies do not import (stage 2 needs stage 1 on" \
         "the same warm machine; tools/gpu_prepare.sh makes the wheels)" | tee -a "$RES" >&2
    exit 2
fi
$PY - "$STAGE" >>"$RES" <<'EOF'
import os, platform, sys, time
import torch, triton
p = torch.cuda.get_device_properties(0)
print(f"# tools/gpu_check.sh {sys.argv[1]}: {torch.cuda.get_device_name()} "
      f"({p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs); torch "
      f"{torch.__version__}, triton {triton.__version__}, Python {platform.python_version()},"
      f" {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
EOF
NAME=$($PY -c "import torch; print(torch.cuda.get_device_name())")
case "$NAME" in                      # dense bf16 TFLOP/s and memory GB/s of the card
    *H200*) TFLOPS=989 GBPS=4800 ;;
    *H100*PCIe*) TFLOPS=756 GBPS=2000 ;;
    *H100*) TFLOPS=989 GBPS=3350 ;;
    *A100*) TFLOPS=312 GBPS=2039 ;;
    *) TFLOPS=0 GBPS=0 ;;
esac

if ((STAGE == 1)); then
    step "tests on CUDA" 200 $PY -m pytest -q -p no:cacheprovider -o addopts="" \
        tests/kernels/test_step_kernels.py tests/kernels/test_external.py \
        tests/kernels/test_triton_attention.py tests/kernels/test_triton_gated_delta.py \
        tests/kernels/test_triton_conv.py tests/kernels/test_triton_moe.py \
        tests/model/test_triton_model.py tests/model/test_step_device.py \
        tests/model/test_graphs.py tests/daemon/test_engine_gpu.py
    step "kernel benchmarks" 80 $PY -m ckptd.tools.bench.kernels --peak-tflops $TFLOPS \
        --peak-gbps $GBPS --ctx 32768 --iters 10 --out "$OUT/kernels.json"
    step "decode, graphs vs eager (35B-A3B-shaped, 8 layers)" 80 \
        $PY -m ckptd.tools.bench.decode --model a3b --layers 8 --batches 1,8,32 \
        --context 1024 --steps 16 --device cuda --json "$OUT/decode.json"
    REPORTS=("$OUT/kernels.json" "$OUT/decode.json")
else
    cat "$MODELS/smollm2.gguf.part00" .gpu/b/smollm2.gguf.part0[1-9] \
        >"$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" 2>>"$LOG"
    step "make the tiny hybrid" 30 $PY -m ckptd.tools.cli make-tiny --arch qwen3_5_text \
        --out "$MODELS/tiny-hybrid"
    step "daemon end to end: tiny hybrid on CUDA" 60 $PY -m ckptd.tools.bench.daemon_e2e \
        --model "$MODELS/tiny-hybrid" --device cuda --context 2048 \
        --serve-arg=--snapshot-interval=256 --json "$OUT/e2e-tiny.json" --log "$LOG"
    step "daemon end to end: SmolLM2 on CUDA" 60 $PY -m ckptd.tools.bench.daemon_e2e \
        --model "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" --device cuda --context 4096 \
        --json "$OUT/e2e-smollm2.json" --log "$LOG"
    step "35B-A3B-shaped TTFT at 32K and 250K (8 layers)" 150 \
        $PY -m ckptd.tools.bench.cache --models a3b --layers 8 --lengths 32768,250000 \
        --repeat 1 --step-tokens 8192 --interval 8192 --device cuda --no-plot \
        --out "$OUT/a3b"
    step "disk restore to the GPU vs a plain read (65K tokens)" 45 \
        $PY -m ckptd.tools.bench.big_state --tokens 65536 --device cuda \
        --json "$OUT/big_state.json"
    REPORTS=("$OUT/e2e-tiny.json" "$OUT/e2e-smollm2.json" "$OUT/big_state.json")
fi

{
    echo
    $PY -m ckptd.tools.bench.gpu_report "${REPORTS[@]}"
    [ -f "$OUT/a3b/report.md" ] && cat "$OUT/a3b/report.md"
    echo
    echo "Stage $STAGE took $SECONDS s; $([ $failed = 0 ] && echo passed || echo FAILED)."
} >>"$RES" 2>>"$LOG"
cat "$RES"
exit $failed

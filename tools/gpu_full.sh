#!/usr/bin/env bash
# Issue 34's one prepared call: the full-size Qwen3.5/3.6-35B-A3B-shaped Q4_K_M GGUF (all
# 40 layers, the released vocabulary of 248,320, random valid blocks: ~21 GB) written on
# the lent GPU machine itself, served by `ckptd serve --device cuda` with kept weights,
# and measured, in at most 9 minutes, writing $OUT/results.md beside its JSON and log.
#
# Here, once:   tools/gpu_full.sh --prepare    (the wheels the machine lacks, in .gpu/full:
#               lmdb, zstandard, gguf, fla-core)
# Then, with the device tool, one call:
#   run(command="tools/gpu_full.sh", carry=[".gpu/full"], timeout_s=560)
#
# In this order (the most important figures first; each step time-limited, so the
# results file is written whatever runs long; a failed or cut step is marked FAILED
# with its first error):
#   1. the GGUF (tools/bench/big_gguf.py --pool-mb: blocks drawn once, written at the
#      speed of memory) into /dev/shm where it has room, else /tmp;
#   2. tools/bench/full_size.py: the daemon's load; a warm-up (Triton's JIT, graphs);
#      decode tokens/s at batch 1 and 8; a 250,000-token context cold, three questions
#      after it, SIGKILL + restart and the first question again; then 32K and 128K cold
#      and a question each; peak GPU memory (nvidia-smi) and host RSS per phase;
#   3. with what is left (at least a minute): tools/bench/kernels.py at the 35B-A3B's
#      shapes, ckptd's kernels beside torch's and fla's in the same run (the kept GEMV
#      per format at batch 1 and 8, the kept experts' decode: tools/bench/kernels_kept.py).
#
# `ONLY=kernels tools/gpu_full.sh` (or `--dry-run`) runs step 3 alone (setup included).
#
# On the CPU first: `tools/gpu_full.sh --dry-run` runs the very same steps here at small
# sizes (--device cpu, 4 layers of 8 experts, a 4,096-token vocabulary, contexts of a
# few hundred tokens, the kernels through the interpreter), and checks the wheels fit
# the machine's Python 3.12.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=${1:-full}
WHEELS=.gpu/full
OUT=${OUT:-$ROOT/gpu-full-out}
case "$MODE" in
    --prepare)
        PY=${PYTHON:-.venv/bin/python}
        rm -rf "$WHEELS" && mkdir -p "$WHEELS"
        # the device image's Python is 3.12 on x86-64; it has numpy, pyyaml, tqdm (gguf's
        # needs) and einops, torch 2.11, triton 3.6 (fla-core's: einops, and torch >= 2.7,
        # triton >= 3.3 under its cuda extra), so fla-core travels alone: the served model's
        # GDN prefill takes fla's kernel (kernels/external/fla.py), the kernel table its row
        $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" \
            lmdb==3.0.0 zstandard==0.25.0 gguf==0.19.0 fla-core==0.6.0 || exit 1
        du -sh "$WHEELS"
        echo 'now: run(command="tools/gpu_full.sh", carry=[".gpu/full"], timeout_s=560)'
        exit 0 ;;
    full)            # ONLY=kernels: the kernel table alone, within a 300 s call
        DEVICE=cuda BUDGET=${BUDGET:-$([ "${ONLY:-}" = kernels ] && echo 280 || echo 530)} LAYERS=40 EXPERTS=256 VOCAB=248320 POOL=64
        BATCH=8 CONTEXTS=250000,32768,131072 ANSWER=32 DECODE=128 WARMUP=512
        SERVE="--parallel 8 --step-tokens 2048 --kv-budget 16GiB --write-queue 8GiB"
        KERNELS=(--shapes a3b --peak-tflops 989) ;;
    --dry-run)       # 2 busy cores: small sizes, the same steps
        DEVICE=cpu BUDGET=${BUDGET:-1500} LAYERS=4 EXPERTS=8 VOCAB=4096 POOL=16 BATCH=4
        CONTEXTS=512,128,256 ANSWER=2 DECODE=4 WARMUP=64
        SERVE="--parallel 4 --step-tokens 256 --kv-budget 1GiB --write-queue 256MiB --threads 2
               --snapshot-interval 64"      # snapshots inside these short contexts
        KERNELS=(--smoke) ;;
    *) echo "usage: tools/gpu_full.sh [--prepare|--dry-run] (see the top of this file)" >&2
       exit 2 ;;
esac
# $OUT holds only what comes back (the device tool returns at most 8 files): results.md,
# log.txt, the two JSON files and the daemon's log; each step's own files stay outside
STEPS=/tmp/ckptd-full-steps
mkdir -p "$OUT" "$STEPS"
RES=$OUT/results.md
LOG=$OUT/log.txt
: >"$RES"
: >"$LOG"
rm -f "$STEPS"/* "$OUT"/*.json "$OUT"/daemon.log
DEADLINE=$((SECONDS + BUDGET))
export PYTHONUNBUFFERED=1
source tools/gpu_lib.sh      # step(), setup()

# 0. what runs: ckptd importable from this checkout, the carried wheels
setup tools/gpu_full.sh "tools/gpu_full.sh --prepare" "$WHEELS"/*.whl
# fla where it imports: then prefill's delta rule and the kernel table's fla rows are fla's
$PY -c 'import fla, einops; print(f"- fla-core {fla.__version__} imports: GDN prefill and '\
'the kernel table take it")' >>"$STEPS/000" 2>>"$LOG" ||
    echo "- fla-core does not import (log.txt): ckptd's GDN prefill, no fla rows" >>"$STEPS/000"

if [ "${ONLY:-}" != kernels ]; then
# 1. the GGUF, where it fits: tmpfs (no disk in the way), else the disk
WHERE=/tmp
shm=$(df --output=avail -B1G /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
((${shm:-0} > LAYERS / 2 + 4)) && WHERE=/dev/shm
GGUF=$WHERE/ckptd-a3b-${LAYERS}l.gguf
rm -f "$GGUF"
step 01 "write the ${LAYERS}-layer 35B-A3B-shaped Q4_K_M GGUF in $WHERE" 200 \
    $PY -m ckptd.tools.bench.big_gguf "$GGUF" --layers "$LAYERS" --experts "$EXPERTS" \
    --vocab "$VOCAB" --tokenizer tests/data/quant/tiny-hybrid-mix.gguf --pool-mb "$POOL"

# 2. the daemon on it, with all the time left: the kernels get what it does not use
PIDS=$STEPS/daemon.pid
left=$((DEADLINE - SECONDS - 20))
step 02 "serve it on $DEVICE: load, decode, ${CONTEXTS} contexts, SIGKILL + restart" \
    "$left" $PY -m ckptd.tools.bench.full_size --model "$GGUF" --device "$DEVICE" \
    --budget $((left - 15)) --contexts "$CONTEXTS" --answer "$ANSWER" --decode "$DECODE" \
    --batch "$BATCH" --warmup "$WARMUP" --serve-arg="$SERVE" --json "$OUT/full_size.json" \
    --log "$OUT/daemon.log" --pid-file "$PIDS" --cache-dir /tmp/ckptd-full-cache
# a daemon the step's time limit left behind would hold the GPU: its own pid only, and
# only while that pid is still this daemon (serving from this call's cache folder)
pid=$(cat "$PIDS" 2>/dev/null)
if [ -n "$pid" ] && grep -qa ckptd-full-cache "/proc/$pid/cmdline" 2>/dev/null; then
    kill -9 "$pid"
fi
rm -f "$GGUF"
fi

# 3. the kernel table at the A3B's shapes, with what is left (HBM: H100 SXM 3.35 TB/s,
# H200 4.8, the datasheets')
if [ "$DEVICE" = cuda ]; then
    KERNELS+=(--peak-gbps "$($PY -c 'import torch
print(4800 if "H200" in torch.cuda.get_device_name() else 3350)' 2>>"$LOG" || echo 3350)")
fi
if ((DEADLINE - SECONDS >= 60)); then
    step 03 "kernels at the 35B-A3B's shapes, beside torch" $((DEADLINE - SECONDS - 5)) \
        $PY -m ckptd.tools.bench.kernels "${KERNELS[@]}" --out "$OUT/kernels.json"
else
    echo "- kernels: SKIPPED ($((DEADLINE - SECONDS)) s left, a minute needed)" >"$STEPS/03"
fi

{
    cat "$STEPS/000"
    cat "$STEPS"/[0-9][0-9] 2>/dev/null
    echo
    for f in "$OUT"/full_size.json "$OUT"/kernels.json; do
        [ -f "$f" ] && $PY -m ckptd.tools.bench.gpu_report "$f" && echo
    done
    echo "The call took $SECONDS s."
} >"$RES" 2>>"$LOG"
cat "$RES"
grep -qE ': (FAILED|SKIPPED)' "$RES" && exit 1
exit 0

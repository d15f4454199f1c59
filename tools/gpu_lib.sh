# Shared by tools/gpu_check.sh and tools/gpu_full.sh (sourced, not run): one time-limited
# step of a device call. The caller sets OUT (results folder), LOG (the whole log),
# BUDGET and DEADLINE (seconds, on bash's $SECONDS clock), and may set STEPS (each
# step's outcome and output; default $OUT/steps).

# step N NAME CAP CMD...: CMD for at most CAP seconds (less if the budget runs out), its
# output to the log, its outcome to $STEPS/N (the results list them in N's order);
# a pytest step's failing tests follow its line
step() {
    local n=$1 name=$2 cap=$3
    shift 3
    local steps=${STEPS:-$OUT/steps}
    local res=$steps/$n left=$((DEADLINE - SECONDS)) log=$steps/$n.log
    ((cap > left)) && cap=$left
    if ((cap < 5)); then
        echo "- $name: SKIPPED (the ${BUDGET} s budget was spent)" >"$res"
        return 1
    fi
    local t0=$SECONDS
    timeout --kill-after=10 "$cap" "$@" >"$log" 2>&1
    local rc=$?
    { echo "== $name (at most $cap s): $*"; cat "$log"; } >>"$LOG"
    if ((rc == 0)); then
        echo "- $name: ok ($((SECONDS - t0)) s)" >"$res"
    else
        local why="exit $rc"
        ((rc == 124 || rc == 137)) && why="cut at $cap s"
        echo "- $name: FAILED ($why after $((SECONDS - t0)) s; log.txt has its output)" >"$res"
        grep -E '^(FAILED|ERROR) ' "$log" | cut -c1-240 | head -40 | sed 's/^/    - /' >>"$res"
        tail -n 3 "$log" | cut -c1-240 | sed 's/^/    > /' >>"$res"
    fi
    return $rc
}

# setup SCRIPT HINT WHEEL...: sets PY and makes ckptd (this checkout) and the carried
# wheels importable: on the GPU (DEVICE=cuda) ckptd through a symlinked package and the
# wheels installed (step 00); on the CPU the wheels only checked to fit the device
# image's Python 3.12 on x86-64. Writes $STEPS/000, the results' first line (the
# device, the versions, the time). Exits 2, saying so in $RES, when ckptd or its
# dependencies do not import (HINT: what makes the wheels).
setup() {
    local script=$1 hint=$2 steps=${STEPS:-$OUT/steps}
    shift 2
    if [ "$DEVICE" = cuda ]; then
        PY=${PYTHON:-python3}
        local site=/tmp/ckptd-site src=/tmp/ckptd-src    # ckptd as an editable install
        mkdir -p "$src/ckptd"
        for d in cache daemon kernels model tools; do ln -sfn "$ROOT/$d" "$src/ckptd/$d"; done
        export PYTHONPATH="$src:$site${PYTHONPATH:+:$PYTHONPATH}"
        step 00 "install the carried wheels" 60 $PY -m pip install -q --no-index --no-deps \
            --no-compile --upgrade --target "$site" "$@"
    else
        PY=${PYTHON:-.venv/bin/python}
        step 00 "the carried wheels fit Python 3.12 on x86-64" 120 $PY -m pip install -q \
            --dry-run --no-index --no-deps --ignore-installed --target /tmp/ckptd-dry \
            --python-version 3.12 --implementation cp --only-binary=:all: \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 "$@"
    fi
    if ! $PY -c "import ckptd.model.runner, ckptd.cache.manager, lmdb, zstandard, gguf" \
        >>"$LOG" 2>&1; then
        cat "$steps/00" >"$RES" 2>/dev/null
        echo "setup failed: ckptd or its dependencies do not import ($hint makes the" \
             "wheels; see log.txt)" | tee -a "$RES" >&2
        exit 2
    fi
    $PY - "$DEVICE" "$script" >"$steps/000" 2>>"$LOG" <<'PYEOF'
import os, platform, sys, time
import torch, triton
if sys.argv[1] == "cuda":
    p = torch.cuda.get_device_properties(0)
    where = (f"{torch.cuda.get_device_name()} ({p.total_memory / 2**30:.0f} GiB, "
             f"{p.multi_processor_count} SMs, sm_{p.major}{p.minor})")
else:
    where = f"the CPU (dry run: {platform.processor() or platform.machine()})"
print(f"# {sys.argv[2]} on {where}; torch {torch.__version__}, triton "
      f"{triton.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs; "
      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
PYEOF
}

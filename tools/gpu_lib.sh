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

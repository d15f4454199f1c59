#!/usr/bin/env bash
# Puts in .gpu/ what tools/gpu_check.sh carries to a lent GPU machine, which reaches no
# package registry (its image has torch, triton, aiohttp, numpy, tokenizers... but not
# these): the wheels of ckptd's dependencies it lacks, fla-core (the optional kernels it
# is compared with), and the embedded SmolLM2 GGUF in two parts, since one call carries
# at most 64 MiB:
#   .gpu/a   wheels + the GGUF's first part   (call 1: tools/gpu_check.sh 1)
#   .gpu/b   the GGUF's second part            (call 2: tools/gpu_check.sh 2)
# Run here, once, after tools/setup.sh. .gpu/ is in .gitignore.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
rm -rf .gpu
mkdir -p .gpu/a .gpu/b
# the device image's Python is 3.12 on x86-64 (/work/.library/device/KINDS.md)
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 -d .gpu/a \
    lmdb==3.0.0 zstandard==0.25.0 gguf==0.19.0 fla-core==0.6.0
gguf=$($PY -c 'from ckptd.model.default import default_model_path; print(default_model_path())')
split -b 48M -d "$gguf" .gpu/smollm2.gguf.part
mv .gpu/smollm2.gguf.part00 .gpu/a/
mv .gpu/smollm2.gguf.part0[1-9] .gpu/b/
du -sh .gpu/a .gpu/b
echo 'now, with the device tool: run(command="tools/gpu_check.sh 1", carry=[".gpu/a"],' \
     'timeout_s=420), then at once run(command="tools/gpu_check.sh 2", carry=[".gpu/b"],' \
     'timeout_s=360)'

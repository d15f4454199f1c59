#!/usr/bin/env bash
# Puts in .gpu/ what tools/gpu_check.sh carries to a lent GPU machine, which reaches no
# package registry (its image has torch, triton, pytest, pytest-xdist, transformers,
# aiohttp, numpy, tokenizers... but not these): the wheels of ckptd's dependencies it
# lacks, fla-core (the optional prefill kernel, run on bf16 there), and the embedded
# SmolLM2 GGUF (98 MB) in two parts, since one call carries at most 64 MiB with the
# working tree:
#   .gpu/a   wheels + the GGUF's first part    (the check:  tools/gpu_check.sh)
#   .gpu/b   the GGUF's second part             (the stash:  tools/gpu_check.sh stash)
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
    lmdb==3.0.0 zstandard==0.25.0 gguf==0.19.0 fla-core==0.6.0 pytest-asyncio==1.5.0
gguf=$($PY -c 'from ckptd.model.default import default_model_path; print(default_model_path())')
# the first part fills .gpu/a up to 50 MB beside the wheels; the working tree is ~5 MB
wheels=$(du -cb .gpu/a/*.whl | tail -1 | cut -f1)
first=$((50 * 1000 * 1000 - wheels))
head -c "$first" "$gguf" >.gpu/a/smollm2.gguf.part0
tail -c +"$((first + 1))" "$gguf" >.gpu/b/smollm2.gguf.part1
sha256sum "$gguf" | cut -d' ' -f1 >.gpu/a/smollm2.gguf.sha256
du -sh .gpu/a .gpu/b
echo 'now, with the device tool, one call after the other (the machine stays warm ~30 s):'
echo '  run(command="tools/gpu_check.sh stash", carry=[".gpu/b"], timeout_s=120)'
echo '  run(command="tools/gpu_check.sh", carry=[".gpu/a"], timeout_s=540)'

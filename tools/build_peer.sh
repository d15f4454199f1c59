#!/usr/bin/env bash
# Builds the llama.cpp peer for `ckptd bench --peer`: llama-cpp-python[server] 0.3.36
# from its PyPI sdist (PyPI has no wheel for it) into .peer-venv, apart from .venv so
# its numpy/pydantic pins never touch ckptd's. Benchmark setup only; CI never needs it.
#
# The CMake flags (tools/ggml_cpu_flags.sh) pin AVX2/FMA, AVX-512 where the CPU has it,
# and turn AMX off: a -DGGML_NATIVE=ON build segfaults in the AMX matmul on these
# machines (see shared ENVIRONMENT.md). ~7 min on 2 cores.
#
# Usage: tools/build_peer.sh, then start the peer and point `ckptd bench --peer` at it:
#   .peer-venv/bin/python -m llama_cpp.server --model M.gguf --port 8090 --n_ctx 8192 \
#       --n_threads 2 --n_threads_batch 2 --logits_all false --flash_attn true
#   ckptd bench --peer http://127.0.0.1:8090 --peer-name llama-cpp-python
# (the server's defaults are n_ctx 2048, half the cores, and logits for every prompt
# token, which slows its prefill; flash attention is ~15% faster here at 512 tokens)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
[ -x .peer-venv/bin/python ] || "$PY" -m venv .peer-venv
# Keep the venv out of git without editing the project's .gitignore.
echo '*' > .peer-venv/.gitignore
PIP=".peer-venv/bin/python -m pip --disable-pip-version-check"
$PIP install -q --upgrade pip
CMAKE_ARGS=$(tools/ggml_cpu_flags.sh)
export CMAKE_ARGS
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
$PIP install --no-binary llama-cpp-python "llama-cpp-python[server]==${VERSION}"
.peer-venv/bin/python -c "import llama_cpp; print('peer built: llama-cpp-python', llama_cpp.__version__)"

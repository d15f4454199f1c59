#!/usr/bin/env bash
# Builds llama.cpp's own C++ server (llama-server) for `ckptd bench --peer-command`,
# from the llama.cpp sources vendored in llama-cpp-python's PyPI sdist (PyPI has no
# llama.cpp of its own). Benchmark setup only; CI never needs it. ~10 min on 2 cores.
#
# The CPU flags are build_peer.sh's (tools/ggml_cpu_flags.sh); no web UI, no curl
# (nothing to download).
#
# Usage: tools/build_llama_server.sh, then
#   ckptd bench --peer-name llama-server --peer-command ".peer-server/llama-server \
#       --port {port} --model M.gguf --ctx-size 8192 --threads 2 --cache-ram 4096 ..."
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
OUT=.peer-server
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    -d "$WORK" "llama-cpp-python==${VERSION}"
tar xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
CPU_FLAGS=$(tools/ggml_cpu_flags.sh)
# shellcheck disable=SC2086  # $CPU_FLAGS is a list of flags
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    $CPU_FLAGS > "$WORK/cmake.log" || { cat "$WORK/cmake.log"; exit 1; }
cmake --build "$WORK/build" --target llama-server -j "$(nproc)"
mkdir -p "$OUT"
echo '*' > "$OUT/.gitignore"    # keep the build out of git without editing .gitignore
cp "$WORK/build/bin/llama-server" "$OUT/"
"$OUT/llama-server" --version 2>&1 | tail -2
echo "built $OUT/llama-server"

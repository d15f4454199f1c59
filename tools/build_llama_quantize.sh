#!/usr/bin/env bash
# Builds llama.cpp's llama-quantize from the sources vendored in llama-cpp-python's PyPI
# sdist, the same way build_llama_server.sh builds the peer server. The kept-weights
# tests (tests/model/test_quant_llamacpp.py) use it to quantize tensors into the GGUF
# types SmolLM2's file lacks; they skip without it (the committed fixtures under
# tests/data/quant/ cover those types in CI). ~10 min on 2 cores.
#
# A copy of the sdist at third_party/cache/ is used when present (no download).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
OUT=.peer-server
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SDIST=third_party/cache/llama_cpp_python-"$VERSION".tar.gz
if [ ! -f "$SDIST" ]; then
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
        -d "$WORK" "llama-cpp-python==${VERSION}"
    SDIST="$WORK"/llama_cpp_python-"$VERSION".tar.gz
fi
tar xzf "$SDIST" -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
CPU_FLAGS=$(tools/ggml_cpu_flags.sh)
# shellcheck disable=SC2086  # $CPU_FLAGS is a list of flags
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    $CPU_FLAGS > "$WORK/cmake.log" || { cat "$WORK/cmake.log"; exit 1; }
cmake --build "$WORK/build" --target llama-quantize -j "$(nproc)"
mkdir -p "$OUT"
[ -f "$OUT/.gitignore" ] || echo '*' > "$OUT/.gitignore"
cp "$WORK/build/bin/llama-quantize" "$OUT/"
echo "built $OUT/llama-quantize"

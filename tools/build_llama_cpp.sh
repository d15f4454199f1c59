#!/usr/bin/env bash
# Builds llama.cpp's own tools from the sources vendored in llama-cpp-python's PyPI sdist
# (PyPI has no llama.cpp of its own) into .peer-server/. Benchmark and optional-test
# setup only; CI never needs it. ~10 min a target on 2 cores.
#   llama-server    the peer for `ckptd bench --peer-command`
#   llama-quantize  quantizes tensors into the GGUF types SmolLM2's file lacks, for
#                   tests/model/test_quant_llamacpp.py (they skip without it; the
#                   committed fixtures under tests/data/quant/ cover those types in CI)
#
# The CPU flags are build_peer.sh's (tools/ggml_cpu_flags.sh); no web UI, no curl
# (nothing to download). A copy of the sdist at third_party/cache/ is used when present.
#
# Usage: tools/build_llama_cpp.sh [TARGET...]   (default: llama-server), then
#   ckptd bench --peer-name llama-server --peer-command ".peer-server/llama-server \
#       --port {port} --model M.gguf --ctx-size 8192 --threads 2 --cache-ram 4096 ..."
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
TARGETS=("${@:-llama-server}")
for t in "${TARGETS[@]}"; do
    case "$t" in
        llama-server|llama-quantize) ;;
        *) echo "build_llama_cpp.sh: unknown target '$t' (llama-server, llama-quantize)" >&2; exit 2 ;;
    esac
done
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
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    $CPU_FLAGS > "$WORK/cmake.log" || { cat "$WORK/cmake.log"; exit 1; }
mkdir -p "$OUT"
[ -f "$OUT/.gitignore" ] || echo '*' > "$OUT/.gitignore"   # the builds stay out of git
for t in "${TARGETS[@]}"; do
    cmake --build "$WORK/build" --target "$t" -j "$(nproc)"
    cp "$WORK/build/bin/$t" "$OUT/"
    echo "built $OUT/$t"
done

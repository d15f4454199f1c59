#!/usr/bin/env bash
# Prints the CMake flags that build llama.cpp's CPU backend for this machine, for both
# peer builds (build_peer.sh, build_llama_cpp.sh): AVX2/FMA always, AVX-512 (VBMI,
# VNNI, BF16) where the CPU has it (a peer built without it would be slower than it can
# be), AMX off (a -DGGML_NATIVE=ON build segfaults in the AMX matmul here; see shared
# ENVIRONMENT.md).
set -euo pipefail
avx512="-DGGML_AVX512=OFF"
if grep -qw avx512f /proc/cpuinfo; then
    avx512="-DGGML_AVX512=ON"
    for f in vbmi vnni bf16; do
        grep -qw "avx512_$f\|avx512$f" /proc/cpuinfo && avx512="$avx512 -DGGML_AVX512_${f^^}=ON"
    done
fi
echo "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
     "-DGGML_BMI2=ON $avx512 -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"

"""moe kernels: naive.py is the plain-torch reference (grouped by expert), triton_moe.py
the Triton grouped GEMM."""

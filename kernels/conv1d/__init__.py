"""conv1d kernels: naive.py is the plain-torch reference."""

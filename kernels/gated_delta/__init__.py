"""gated_delta kernels: naive.py is the plain-torch reference."""

"""rotary kernels: naive.py is the plain-torch reference."""

"""mamba1 kernels (selective scan): naive.py is the plain-torch reference."""

"""mamba2 kernels (SSD scan): naive.py is the plain-torch reference."""

"""paged_attention kernels: naive.py is the plain-torch reference."""

"""The shared remote tier: S3-compatible object storage below LMDB (tier.py)."""

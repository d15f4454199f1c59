"""The store below the device tier: RAM and LMDB behind one CacheStore."""

from ckptd.cache.store.store import CacheStore, StoreConfig

__all__ = ["CacheStore", "StoreConfig"]

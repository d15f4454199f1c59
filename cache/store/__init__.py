"""The store below the device tier: RAM and LMDB behind one CacheStore."""

from ckptd.cache.store.config import StoreConfig
from ckptd.cache.store.store import CacheStore

__all__ = ["CacheStore", "StoreConfig"]

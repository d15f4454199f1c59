"""A child process for crash and read-only tests: writes prompts forever (until killed)."""

from __future__ import annotations

import sys

from cache.store import CacheStore
from tests.cache.conftest import B, fake_pages, fake_snapshot, hybrid_spec

if __name__ == "__main__":
    path, start = sys.argv[1], int(sys.argv[2])
    spec = hybrid_spec()
    store = CacheStore(path, spec, "fp-test")
    i = start
    print("ready", flush=True)
    while True:
        toks = [i % 7, i % 5] + list(range(i, i + 4 * B + i % 3))
        store.put_blocks(toks, 0, fake_pages(spec, toks, 0, len(toks) // B))
        store.put_snapshot(toks, fake_snapshot(spec, toks))
        if i % 3 == 0:
            store.flush()
        i += 1

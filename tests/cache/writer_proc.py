"""A child process for the crash and read-only tests: writes prompts until killed.

    python -m tests.cache.writer_proc STORE_DIR FIRST_PROMPT
Prints "ready" once the store is open, then "committed N" after each flush.
"""

from __future__ import annotations

import sys

from ckptd.cache.store.store import CacheStore
from tests.cache.conftest import FP, fill, hybrid_spec


def prompt(i: int) -> list[int]:
    """Prompts that share prefixes in several ways: a common head, a per-group middle."""
    return [i % 3, i % 5] + list(range(i, i + 8 + i % 9))


if __name__ == "__main__":
    path, first = sys.argv[1], int(sys.argv[2])
    spec = hybrid_spec()
    store = CacheStore(path, spec, FP, batch=8)
    print("ready", flush=True)
    i = first
    while True:
        fill(store, spec, prompt(i))
        if i % 4 == 0:
            store.flush()
            print(f"committed {i}", flush=True)
        i += 1

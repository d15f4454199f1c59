"""Walking an LMDB file in a child process before the daemon trusts it.

LMDB does not checksum its own pages (ckptd's values carry checksums; the B-tree
pages that index them do not). A flipped bit in a branch or leaf page can make
LMDB follow a wild page number and crash the process that reads it, so a store
file is first walked by a throwaway child: every key of every sub-database and
every index record. If the child dies or fails, the file is not opened; the
caller sets it aside and starts empty (the cache can always be recomputed).
Value pages are not read here: a damaged value fails its checksum on use.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_WALK = """
import sys, lmdb
env = lmdb.open(sys.argv[1], readonly=True, lock=False, max_dbs=4)
with env.begin() as txn:
    for name in (b"blocks", b"snapshots", b"meta", b"info"):
        if txn.get(name) is None:
            continue
        db = env.open_db(name, txn=txn, create=False)
        for _ in txn.cursor(db=db).iternext(keys=True, values=name in (b"meta", b"info")):
            pass
"""


def walk_fails(path: Path, timeout: float = 300.0) -> str | None:
    """Why the LMDB store at `path` can't be walked safely, or None when it can."""
    try:
        res = subprocess.run([sys.executable, "-c", _WALK, str(path)], capture_output=True,
                             text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"walking its index took more than {timeout:.0f} s"
    if res.returncode < 0:
        return f"walking its index crashed the reader (signal {-res.returncode})"
    if res.returncode != 0:
        lines = (res.stderr or "").strip().splitlines()
        return f"walking its index failed: {lines[-1] if lines else res.returncode}"
    return None

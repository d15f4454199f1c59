"""The cache folder at start-up: made, proved writable and locked for this daemon."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def prepare_cache_dir(path: Path):
    """Create the cache folder, prove it writable and lock it for this process, so a bad
    --cache-dir (or one another daemon serves) is one clear error at start-up, not a
    model load that fails after the port opened. Returns the lock: keep it open."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"--cache-dir {path}: exists and is not a folder") from None
    except OSError as e:
        raise ValueError(f"--cache-dir {path}: cannot create it: {e.strerror}") from None
    probe = path / f".write-test-{os.getpid()}"
    try:
        with open(probe, "wb") as fh:
            fh.write(b"x")
            fh.flush()
            os.fsync(fh.fileno())
        probe.unlink()
    except OSError as e:
        raise ValueError(f"--cache-dir {path}: not writable: {e.strerror}") from None
    # Two daemons on one folder would each keep their own index and budget of the
    # same store, and overwrite each other's contexts. The kernel drops the lock
    # when the process dies, however it dies.
    lock = open(path / "daemon.lock", "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise ValueError(f"--cache-dir {path}: another ckptd serves it (pid {holder})") \
            from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock

"""Where `ckptd inspect` reads a cache from: the LMDB store itself, or a running daemon's
HTTP API. Both hand out entries as the dicts of cache.admin.EntryInfo.to_dict() and
stats in the shape of GET /cache/stats, so the commands don't care which one it is.

Every failure a user can cause (no store there, daemon unreachable, wrong API key,
unknown key) is raised as ValueError or FileNotFoundError with a one-line message.
"""

from __future__ import annotations

import fcntl
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from ckptd.cache.keys import key_from_hex

ALL = 2**62
PAGE = 1000                  # the most GET /cache/entries returns at once
HTTP_DETOKENIZE_CALLS = 256  # previews through the daemon cost a request each


def check_key(text: str) -> str:
    """A key as the store and the daemon take it (lowercase hex); ValueError otherwise."""
    return key_from_hex(text).hex()


def held_elsewhere(path: Path) -> bool:
    """True when another process has the LMDB environment at `path` open.

    Every process that opens an environment holds a shared fcntl lock on byte 0 of
    lock.mdb for as long as it is open; an exclusive lock on it is refused while any
    does. This must be asked before this process opens the environment itself:
    closing any descriptor of a file drops all of a process's fcntl locks on it.
    """
    lock = path / "lock.mdb"
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        return True
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
        return False
    finally:
        os.close(fd)


class LocalSource:
    """The store in a cache folder: read-only for looking, read-write (and only when no
    other process has it open) for changing it."""

    url = None

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.where = str(self.path)

    @contextmanager
    def open(self, write: bool = False, create: bool = False, **config):
        # imported here: the store imports torch, which `--url` never needs
        import lmdb

        from ckptd.cache.store.store import CacheStore

        if not (self.path / "data.mdb").exists() and not create:
            raise FileNotFoundError(f"no cache store at {self.path}")
        if write and held_elsewhere(self.path):
            # The daemon keeps its index in memory: a change made beside it would be
            # undone (pins) or never noticed (deletes), so changes go through the daemon.
            raise ValueError(f"the cache store at {self.path} is open in another process "
                             "(a running daemon?); stop it, or change the cache through "
                             "the daemon with --url")
        try:
            store = (CacheStore(self.path, None, None, **config) if write
                     else CacheStore.open_readonly(self.path))
        except lmdb.Error as e:
            raise ValueError(f"cannot open the cache store at {self.path}: {e}") from None
        try:
            yield store
        finally:
            store.close()

    def stats(self) -> dict:
        with self.open() as s:
            return s.stats()

    def entries(self, sort: str = "last_used", kind: str | None = None) -> list[dict]:
        with self.open() as s:
            return [e.to_dict() for e in s.entries(0, ALL, sort, kind)]

    def value(self, key: str) -> bytes | None:
        with self.open() as s:
            return s.disk.get(bytes.fromhex(key))

    def pin(self, key: str, pinned: bool) -> int:
        with self.open(write=True) as s:
            if s.get_info(key) is None:
                raise ValueError(f"no cache entry {key}")
            return s.pin(key) if pinned else s.unpin(key)

    def delete(self, key: str) -> int:
        with self.open(write=True) as s:
            n = s.delete(key)
        if n == 0:
            raise ValueError(f"no cache entry {key}")
        return n

    def clear(self, include_pinned: bool) -> int:
        with self.open(write=True) as s:
            return s.clear(include_pinned)


class HttpSource:
    """A running daemon's cache admin endpoints (see daemon/http/admin.py)."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 30.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"--url must be http://HOST:PORT, got {url!r}")
        self.url = url.rstrip("/")
        self.where = self.url
        self.api_key, self.timeout = api_key, timeout

    def request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise ValueError(self._http_error(e)) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ValueError(f"cannot reach the daemon at {self.url}: {reason}") from None
        except json.JSONDecodeError:
            raise ValueError(f"{self.url}{path} did not answer JSON: is it a ckptd "
                             "daemon?") from None

    def _http_error(self, e: urllib.error.HTTPError) -> str:
        try:
            message = json.loads(e.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = e.reason
        if e.code == 401:
            return f"the daemon refused the request (401: {message}); check --api-key"
        return f"the daemon answered {e.code}: {message}"

    def stats(self) -> dict:
        return self.request("GET", "/cache/stats")

    def page(self, offset: int, limit: int, sort: str, kind: str | None) -> dict:
        q = {"offset": offset, "limit": limit, "sort": sort}
        if kind is not None:
            q["kind"] = kind
        return self.request("GET", "/cache/entries?" + urllib.parse.urlencode(q))

    def entries(self, sort: str = "last_used", kind: str | None = None) -> list[dict]:
        # The daemon sorts its whole index for every page, so pages line up as long as
        # nothing is written meanwhile; a key seen twice (an entry moved up) counts once.
        out: dict[str, dict] = {}
        offset: int | None = 0
        while offset is not None:
            page = self.page(offset, PAGE, sort, kind)
            for e in page["data"]:
                out.setdefault(e["key"], e)
            offset = page["next_offset"]
        return list(out.values())

    def value(self, key: str) -> bytes | None:
        raise ValueError("the HTTP API does not serve stored values: use --cache-dir")

    def pin(self, key: str, pinned: bool) -> int:
        path = "/cache/pin" if pinned else "/cache/unpin"
        return self.request("POST", path, {"key": key})["changed"]

    def delete(self, key: str) -> int:
        return self.request("DELETE", f"/cache/entries/{key}")["deleted"]

    def clear(self, include_pinned: bool) -> int:
        return self.request("POST", "/cache/clear", {"include_pinned": include_pinned})["deleted"]

    def detokenize(self, ids: list[int]) -> str | None:
        return self.request("POST", "/detokenize", {"tokens": ids})["content"]


def is_hybrid(store) -> bool:
    """Whether the store's model has recurrent layers, from a snapshot's stored tensors
    (gc ranks leaf blocks by it, as the daemon does); False when there is no snapshot."""
    from ckptd.cache import codec  # imported here: it imports torch (see open)

    with store.catalog.lock:
        snaps = [k for k, m in store.catalog.index.rows.items() if m.kind == "snapshot"]
    for key in snaps[:16]:
        try:
            header = codec.read_header(store.disk.get(key) or b"")
        except codec.CorruptValue:
            continue
        return any(t["name"] == "ssm" for t in header["tensors"])
    return False


def decoder(model: str | None, source):
    """ids -> text: the --model tokenizer, else a daemon's /detokenize, else None."""
    if model:
        # imported here: the tokenizer's module imports torch (GGUF), wanted with --model only
        from ckptd.model.text.tokenizer import load_tokenizer

        tok = load_tokenizer(model)
        return tok.decode
    if isinstance(source, HttpSource):
        calls = [0]

        def via_daemon(ids: list[int]) -> str | None:
            calls[0] += 1
            return source.detokenize(ids) if calls[0] <= HTTP_DETOKENIZE_CALLS else None
        return via_daemon
    return None


def resolve_key(source, text: str, entries: list[dict] | None = None) -> str:
    """A full key, or the one key that starts with a prefix of 8+ hex digits."""
    t = text.strip().lower()
    if len(t) >= 32 or len(t) < 8 or any(c not in "0123456789abcdef" for c in t):
        return check_key(text)
    rows = source.entries() if entries is None else entries
    found = [e["key"] for e in rows if e["key"].startswith(t)]
    if len(found) != 1:
        raise ValueError(f"no cache entry starts with {text!r}" if not found else
                         f"{len(found)} cache entries start with {text!r}: give more digits")
    return found[0]

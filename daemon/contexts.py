"""Named static contexts: a prefix registered once, named by later requests.

The registry is a small JSON file in the cache folder (written whole, through a
temporary file and a rename, so a crash leaves the old or the new file), which
is how contexts survive restarts. It keeps a context's source (text or chat
messages), not its tokens: tokenizing again gives the same ids, so the same cache
keys, and the file stays small. Methods do file I/O: call them off the event loop.
"""

from __future__ import annotations

import hmac
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Context:
    name: str
    text: str | None = None
    messages: list[dict] | None = None
    salt: str | None = None
    pinned: bool = True
    tokens: int = 0                       # prompt length, recorded at registration
    key: str | None = None                # hex key of the cache entry that ends the prefix
    created: float = field(default_factory=time.time)

    def visible_to(self, salt: str | None) -> bool:
        """A salted context is its tenant's: only requests with the same salt use it."""
        return self.salt is None or (salt is not None and
                                     hmac.compare_digest(self.salt.encode(), salt.encode()))

    def public(self) -> dict:
        # The salt is a tenant's secret: say whether there is one, never what it is.
        return {"name": self.name, "object": "context", "tokens": self.tokens,
                "pinned": self.pinned, "salted": self.salt is not None, "key": self.key,
                "created": int(self.created),
                "source": "text" if self.text is not None else "messages"}


class ContextRegistry:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.lock = threading.Lock()           # guards items; held for no I/O
        self.write_lock = threading.Lock()     # orders file writes like the changes
        self.items: dict[str, Context] = {}
        if self.path.exists():
            try:
                raw = json.loads(self.path.read_text())
                self.items = {c["name"]: Context(**c) for c in raw.get("contexts", [])}
            except (json.JSONDecodeError, TypeError, KeyError) as e:
                raise ValueError(f"{self.path} is not a context registry: {e}") from None

    def get(self, name: str) -> Context | None:
        with self.lock:
            return self.items.get(name)

    def all(self) -> list[Context]:
        with self.lock:
            return sorted(self.items.values(), key=lambda c: c.name)

    def put(self, ctx: Context) -> None:
        with self.write_lock:
            with self.lock:
                self.items[ctx.name] = ctx
                data = self._dump()
            self._write(data)

    def delete(self, name: str) -> Context | None:
        with self.write_lock:
            with self.lock:
                ctx = self.items.pop(name, None)
                data = self._dump()
            if ctx is not None:
                self._write(data)
        return ctx

    def _dump(self) -> str:
        return json.dumps({"version": 1, "contexts": [asdict(c) for c in self.items.values()]},
                          ensure_ascii=False)

    def _write(self, data: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

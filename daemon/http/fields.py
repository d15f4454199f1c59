"""Typed access to the fields of a JSON object; every error names its field as the
client wrote it.

JSON types are checked strictly (true is not an int, 1.5 is not an int) and `null`
means "not given". A route whose API names a field otherwise (Anthropic's
`stop_sequences` for `stop`, Responses' `max_output_tokens` for `max_tokens`) reads
the same parsers through its `Names`: internal name in, the client's name in errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ckptd.daemon.http.errors import bad_request

MAX_STOPS = 16


@dataclass(frozen=True)
class Names:
    """The fields a route has, by internal name: `renamed` ones under the route's own
    name, `only` (when given) the only others it has, `dropped` ones it lacks."""
    renamed: Mapping[str, str] = field(default_factory=dict)
    only: frozenset[str] | None = None
    dropped: frozenset[str] = frozenset()

    def __call__(self, name: str) -> str | None:
        """The route's name of an internal field; None when the route has no such field."""
        if name in self.renamed:
            return self.renamed[name]
        if name in self.dropped or (self.only is not None and name not in self.only):
            return None
        return name

    def fields(self) -> set[str]:
        """Every field the route has (for a route with `only`)."""
        return set(self.renamed.values()) | set(self.only or ())


SAME = Names()


class Fields:
    """Typed access to one JSON object's fields. `where` is the object's own path in the
    body ("stream_options"), put before its fields' names in errors."""

    def __init__(self, data: object, where: str = "body", names: Names = SAME) -> None:
        if not isinstance(data, dict):
            raise bad_request(f"the {where} must be a JSON object", None if where == "body"
                              else where, "invalid_type")
        self.data = data
        self.names = names
        self.prefix = "" if where == "body" else f"{where}."

    def key(self, name: str) -> str:
        """The field as the client names it, for an error."""
        return self.prefix + (self.names(name) or name)

    def get(self, name: str) -> object:
        """The raw value of a field (None when absent, or not a field of this route)."""
        own = self.names(name)
        return None if own is None else self.data.get(own)

    def has(self, name: str) -> bool:
        own = self.names(name)
        return own is not None and own in self.data

    def int(self, name: str, default: int | None = None, lo: int | None = None,
            hi: int | None = None) -> int | None:
        v = self.get(name)
        if v is None:
            return default
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        key = self.key(name)
        if isinstance(v, bool) or not isinstance(v, int):
            raise type_error(key, "an integer", v)
        if lo is not None and v < lo:
            raise bad_request(f"{key} must be >= {lo}, got {v}", key)
        if hi is not None and v > hi:
            raise bad_request(f"{key} must be <= {hi}, got {v}", key)
        return v

    def float(self, name: str, default: float | None = None, lo: float | None = None,
              hi: float | None = None) -> float | None:
        v = self.get(name)
        if v is None:
            return default
        key = self.key(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise type_error(key, "a number", v)
        v = float(v)
        if v != v or (lo is not None and v < lo) or (hi is not None and v > hi):
            raise bad_request(f"{key} must be in [{lo}, {hi}], got {v}", key)
        return v

    def bool(self, name: str, default: bool = False) -> bool:
        v = self.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise type_error(self.key(name), "a boolean", v)
        return v

    def str(self, name: str, default: str | None = None, required: bool = False,
            max_len: int | None = None) -> str | None:
        v = self.get(name)
        key = self.key(name)
        if v is None:
            if required:
                raise bad_request(f"{key} is required", key, "missing_field")
            return default
        if not isinstance(v, str):
            raise type_error(key, "a string", v)
        if max_len is not None and len(v) > max_len:
            raise bad_request(f"{key} is longer than {max_len} characters", key)
        return v

    def stop(self, name: str = "stop") -> tuple[str, ...]:
        v = self.get(name)
        if v is None:
            return ()
        key = self.key(name)
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise type_error(key, "a string or a list of strings", v)
        if len(items) > MAX_STOPS:
            raise bad_request(f"{key} holds at most {MAX_STOPS} strings", key)
        if any(not s for s in items):
            raise bad_request(f"{key} must not hold empty strings", key)
        return tuple(items)

    def token_ids(self, name: str, vocab_size: int) -> list[int]:
        v = self.get(name)
        key = self.key(name)
        if not isinstance(v, list) or not set(map(type, v)) <= {int}:   # bool is not int
            raise type_error(key, "a list of token ids", v)
        check_tokens(v, vocab_size, key)
        return v


def check_tokens(ids: list[int], vocab_size: int, name: str) -> None:
    if not ids or (min(ids) >= 0 and max(ids) < vocab_size):     # in C: long prompts
        return
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise bad_request(f"{name}: token id {bad} is outside the vocabulary (0..{vocab_size - 1})",
                          name)


def type_error(name: str, want: str, got: object):
    return bad_request(f"{name} must be {want}, got {type(got).__name__}", name, "invalid_type")

"""Typed access to the fields of a JSON object; every error names its field.

JSON types are checked strictly (true is not an int, 1.5 is not an int) and `null`
means "not given".
"""

from __future__ import annotations

from ckptd.daemon.http.errors import bad_request

MAX_STOPS = 16


class Fields:
    """Typed access to one JSON object's fields."""

    def __init__(self, data: object, where: str = "body") -> None:
        if not isinstance(data, dict):
            raise bad_request(f"the {where} must be a JSON object", None, "invalid_type")
        self.data = data

    def _get(self, name: str):
        return self.data.get(name)

    def int(self, name: str, default: int | None = None, lo: int | None = None,
            hi: int | None = None) -> int | None:
        v = self._get(name)
        if v is None:
            return default
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise type_error(name, "an integer", v)
        if lo is not None and v < lo:
            raise bad_request(f"{name} must be >= {lo}, got {v}", name)
        if hi is not None and v > hi:
            raise bad_request(f"{name} must be <= {hi}, got {v}", name)
        return v

    def float(self, name: str, default: float | None = None, lo: float | None = None,
              hi: float | None = None) -> float | None:
        v = self._get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise type_error(name, "a number", v)
        v = float(v)
        if v != v or (lo is not None and v < lo) or (hi is not None and v > hi):
            raise bad_request(f"{name} must be in [{lo}, {hi}], got {v}", name)
        return v

    def bool(self, name: str, default: bool = False) -> bool:
        v = self._get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise type_error(name, "a boolean", v)
        return v

    def str(self, name: str, default: str | None = None, required: bool = False,
            max_len: int | None = None) -> str | None:
        v = self._get(name)
        if v is None:
            if required:
                raise bad_request(f"{name} is required", name, "missing_field")
            return default
        if not isinstance(v, str):
            raise type_error(name, "a string", v)
        if max_len is not None and len(v) > max_len:
            raise bad_request(f"{name} is longer than {max_len} characters", name)
        return v

    def stop(self, name: str = "stop") -> tuple[str, ...]:
        v = self._get(name)
        if v is None:
            return ()
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise type_error(name, "a string or a list of strings", v)
        if len(items) > MAX_STOPS:
            raise bad_request(f"{name} holds at most {MAX_STOPS} strings", name)
        if any(not s for s in items):
            raise bad_request(f"{name} must not hold empty strings", name)
        return tuple(items)

    def token_ids(self, name: str, vocab_size: int) -> list[int]:
        v = self._get(name)
        if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                              for t in v):
            raise type_error(name, "a list of token ids", v)
        check_tokens(v, vocab_size, name)
        return v


def check_tokens(ids: list[int], vocab_size: int, name: str) -> None:
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise bad_request(f"{name}: token id {bad} is outside the vocabulary (0..{vocab_size - 1})",
                          name)


def type_error(name: str, want: str, got: object):
    return bad_request(f"{name} must be {want}, got {type(got).__name__}", name, "invalid_type")

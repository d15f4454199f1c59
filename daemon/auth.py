"""API-key check: with --api-key, every endpoint but /health needs `Authorization: Bearer KEY`."""

from __future__ import annotations

import hmac

from aiohttp import web

from daemon.errors import ApiError

OPEN_PATHS = frozenset({"/health"})


def check(request: web.Request, api_key: str | None) -> None:
    """Raise a 401 ApiError unless the request carries the key (compared in constant time)."""
    if api_key is None or request.path in OPEN_PATHS:
        return
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise ApiError(401, "missing API key: send 'Authorization: Bearer KEY'", None,
                       "missing_api_key", {"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(given.strip().encode(), api_key.encode()):
        raise ApiError(401, "invalid API key", None, "invalid_api_key",
                       {"WWW-Authenticate": "Bearer"})

"""Who may call what.

- `--api-key`: every endpoint but /health and the cache page's files (/, /page.js: no
  data, which the page reads from /cache/* with a key it asks for) needs
  `Authorization: Bearer KEY`.
- `--admin-key`: the cache admin endpoints (/cache/*) need this key, and the API key is
  not enough for them; the admin key opens every other endpoint too.
- `--no-admin`: /cache/* answers 403 to everyone.

Keys are compared in constant time, and every configured key is compared on each
request, so the time taken does not tell which key (or how much of one) matched.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from ckptd.daemon.config import ServeConfig
from ckptd.daemon.http.errors import ApiError

OPEN_PATHS = frozenset({"/health", "/v1/health", "/", "/page.js"})
ADMIN_PREFIX = "/cache/"


def is_admin(request: web.Request) -> bool:
    # The matched route, not the raw path: what decides is the handler that would run.
    resource = getattr(getattr(request.match_info, "route", None), "resource", None)
    path = resource.canonical if resource is not None else request.path
    return path.startswith(ADMIN_PREFIX) or request.path.startswith(ADMIN_PREFIX)


def check(request: web.Request, cfg: ServeConfig) -> None:
    """Raise a 401/403 ApiError unless the request may go on. A CORS preflight carries
    no credentials (browsers never send them on OPTIONS): it is answered before this."""
    if request.path in OPEN_PATHS:
        return
    if is_admin(request):
        if cfg.no_admin:
            raise ApiError(403, "the cache admin API is turned off on this server (--no-admin)",
                           None, "admin_disabled")
        if cfg.admin_key is not None:
            _require(request, [cfg.admin_key], "admin API key")
            return
    if cfg.api_key is None:
        return
    _require(request, [k for k in (cfg.api_key, cfg.admin_key) if k is not None], "API key")


def _require(request: web.Request, keys: list[str], what: str) -> None:
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        # Anthropic-style clients send the key as x-api-key; llama-server takes it too
        given, scheme = request.headers.get("X-Api-Key", ""), "bearer"
    if not given.strip():
        raise ApiError(401, f"missing {what}: send 'Authorization: Bearer KEY'", None,
                       "missing_api_key", {"WWW-Authenticate": "Bearer"})
    token = given.strip().encode()
    ok = False
    for key in keys:                     # no early exit: each key costs the same time
        ok |= hmac.compare_digest(token, key.encode())
    if not ok:
        raise ApiError(401, f"invalid {what}", None, "invalid_api_key",
                       {"WWW-Authenticate": "Bearer"})

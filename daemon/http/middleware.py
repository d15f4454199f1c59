"""Request middlewares: access log + metrics (outermost), JSON errors, CORS, API key,
waking a sleeping daemon (innermost)."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from ckptd.daemon.http import auth
from ckptd.daemon.http.common import SERVICE, error_response
from ckptd.daemon.http.errors import ApiError

log = logging.getLogger("ckptd.http")


def _route(request: web.Request) -> str:
    info = request.match_info
    route = getattr(info, "route", None)
    resource = getattr(route, "resource", None)
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def observe(request: web.Request, handler) -> web.StreamResponse:
    t0 = time.perf_counter()
    status = 499                   # client closed the connection before an answer
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    finally:
        dt = time.perf_counter() - t0
        request.app[SERVICE].metrics.observe_http(_route(request), request.method, status, dt)
        log.info("%s %s %d %.1f ms", request.method, request.path_qs, status, dt * 1000)


@web.middleware
async def errors(request: web.Request, handler) -> web.StreamResponse:
    """Every failure becomes a JSON error body; nothing leaks a traceback to a client."""
    try:
        return await handler(request)
    except ApiError as e:
        return error_response(e)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
        msg = f"{e.reason}: {request.method} {request.path}" if e.status in (404, 405) \
            else e.reason
        headers = {k: v for k, v in e.headers.items() if k.lower() == "allow"}
        return error_response(ApiError(e.status, msg, None, code.get(e.status), headers))
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("internal error answering %s %s", request.method, request.path)
        return error_response(ApiError(500, "internal server error (see the daemon's log)",
                                       None, "internal_error"))


_LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def allowed_origin(origin: str, setting: str | None) -> bool:
    """Whether --cors-origins lets this Origin call: '*', 'localhost' (any port of a
    loopback host), or a comma-separated list of exact origins."""
    if not origin or setting is None:
        return False
    if setting == "*":
        return True
    if setting == "localhost":
        scheme, sep, rest = origin.partition("://")
        host = rest.rsplit(":", 1)[0] if not rest.endswith("]") else rest
        return bool(sep) and scheme in ("http", "https") and host in _LOCAL_HOSTS
    return origin in {o.strip() for o in setting.split(",")}


def _cors_headers(request: web.Request) -> dict[str, str]:
    cfg = request.app[SERVICE].cfg
    origin = request.headers.get("Origin", "")
    if not allowed_origin(origin, cfg.cors_origins):
        return {}
    out = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
    if cfg.cors_credentials:
        out["Access-Control-Allow-Credentials"] = "true"
    return out


@web.middleware
async def cors(request: web.Request, handler) -> web.StreamResponse:
    """Answer preflights before the API key is asked for (browsers send no credentials
    on OPTIONS). The headers a request asks to send are allowed by name: a wildcard
    never covers Authorization (Fetch standard). Without --cors-origins nothing is
    allowed."""
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        headers = _cors_headers(request)
        if headers:
            headers.update({"Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
                            "Access-Control-Allow-Headers": request.headers.get(
                                "Access-Control-Request-Headers", "") or "*",
                            "Access-Control-Max-Age": "600"})
        return web.Response(status=200, headers=headers)
    return await handler(request)


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: every answer (streams too) to an allowed origin says so."""
    response.headers.update(_cors_headers(request))


@web.middleware
async def api_key(request: web.Request, handler) -> web.StreamResponse:
    auth.check(request, request.app[SERVICE].cfg)
    return await handler(request)


# Reads that answer while the daemon sleeps without waking it (llama-server's: health,
# metrics, props, models; also slots, whose view needs no model, the cache admin
# routes, which read and change only the store, and the cache page's files).
_AWAKE_NOT_NEEDED = ("/health", "/v1/health", "/metrics", "/props", "/models", "/v1/models",
                     "/slots", "/openapi.json", "/", "/page.js")


def wakes(method: str, path: str) -> bool:
    """Whether a request needs the model (a sleeping daemon loads it first)."""
    if path.startswith("/cache/"):
        return False
    return not (method in ("GET", "HEAD", "OPTIONS") and path in _AWAKE_NOT_NEEDED)


@web.middleware
async def wake(request: web.Request, handler) -> web.StreamResponse:
    """A request that needs the model waits for it to load when the daemon sleeps
    (daemon/sleep.py); it also counts as a task for the idle clock."""
    svc = request.app[SERVICE]
    if wakes(request.method, request.path):
        await svc.wake()
    return await handler(request)

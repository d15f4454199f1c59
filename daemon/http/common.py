"""What every handler shares: the service, JSON bodies in and out, blocking calls off the loop."""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Callable
from typing import TypeVar

from aiohttp import web

from ckptd.daemon.http.errors import ApiError, bad_request
from ckptd.daemon.service import Service

SERVICE: web.AppKey[Service] = web.AppKey("service", Service)
# A body parsed already, carried by a request made inside the daemon (vertex.py)
BODY = "ckptd.body"
T = TypeVar("T")


def service(request: web.Request) -> Service:
    return request.app[SERVICE]


def ready(request: web.Request) -> Service:
    svc = request.app[SERVICE]
    svc.require_ready()
    return svc


# Lone surrogates come only from \uD800-\uDFFF escapes (valid UTF-8 holds none): a body
# without one needs no re-encoding check, which costs a 64K-token prompt ~25 ms
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: web.Request) -> object:
    """The body as JSON: 413 when too big, 400 for invalid UTF-8 or malformed JSON."""
    if BODY in request:
        return request[BODY]
    limit = request.app[SERVICE].cfg.max_body
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, f"request body is {request.content_length} bytes; the limit is "
                            f"{limit} (--max-body)")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"request body is larger than the limit of {limit} bytes "
                            "(--max-body)") from None
    if not raw.strip():
        raise bad_request("the request body is empty; send a JSON object", None, "invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not valid UTF-8 (byte {e.start})", None,
                          "invalid_utf8") from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except ValueError as e:
        raise bad_request(f"malformed JSON: {e}", None, "invalid_json") from None
    except RecursionError:       # the parser recurses per level: a hostile body nests deep
        raise bad_request("the JSON body is nested too deeply", None, "invalid_json") \
            from None
    if _SURROGATE_ESCAPE.search(text) is None:
        return data
    try:                 # "\ud800" escapes decode to lone surrogates no tokenizer can take
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise bad_request("the JSON body is nested too deeply", None, "invalid_json") \
            from None
    except UnicodeEncodeError:
        raise bad_request("the request holds an invalid Unicode escape (a lone surrogate)",
                          None, "invalid_utf8") from None
    return data


def json_response(data: dict, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.json_response(data, status=status, headers=headers,
                             dumps=functools.partial(json.dumps, ensure_ascii=False))


def error_response(err: ApiError) -> web.Response:
    return json_response(err.body(), err.status, err.headers)


async def blocking(fn: Callable[..., T], *args) -> T:
    """Run a blocking call (LMDB, tokenizing a long prompt) on the default executor."""
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))


def query_int(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        raise bad_request(f"{name} must be an integer, got {raw!r}", name, "invalid_type") \
            from None
    if not lo <= v <= hi:
        raise bad_request(f"{name} must be in {lo}..{hi}, got {v}", name)
    return v

"""Operations endpoints: /health, /metrics, /openapi.json and the cache admin API.

Cache calls read LMDB (and pin/clear flush the writer), so they run on the
executor, never on the event loop.
"""

from __future__ import annotations

from aiohttp import web

from ckptd.daemon.http.common import blocking, json_response, query_int, read_json, ready, service
from ckptd.daemon.http.errors import ApiError, bad_request, not_supported
from ckptd.daemon.http.openapi import document
from ckptd.daemon.http.schemas import ClearRequest, KeyRequest
from ckptd.daemon.service import LOADING, READY

SORTS = ("last_used", "size", "hits", "created", "position")
KINDS = ("block", "snapshot")


async def health(request: web.Request) -> web.Response:
    svc = service(request)
    err = svc.unavailable()
    if err is None:
        return json_response({"status": "ok", "model": svc.model_id, **svc.rt.engine.load})
    status = "loading model" if svc.state == LOADING else svc.state
    return json_response({"status": status, **err.body()}, 503, err.headers)


async def metrics(request: web.Request) -> web.Response:
    svc = service(request)
    if not svc.cfg.metrics:
        raise not_supported("the /metrics endpoint (this server runs with --no-metrics)")
    ready_ = svc.state == READY
    # asleep: the snapshot taken on falling asleep, as llama-server answers
    text = svc.metrics.asleep_text() if svc.sleeping else None
    if text is None:
        stats = await blocking(svc.rt.store.stats) if ready_ else None
        text = svc.metrics.render(svc.rt.engine if ready_ else None, stats, svc.state,
                                  svc.inflight)
    return web.Response(text=text, content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff",
                                 "Process-Start-Time-Unix": str(int(svc.started))})


async def openapi(request: web.Request) -> web.Response:
    return json_response(document(service(request).model_id))


def _store(request: web.Request):
    return ready(request).rt.store


async def cache_stats(request: web.Request) -> web.Response:
    svc = ready(request)
    engine = svc.rt.engine
    stats = await blocking(svc.rt.store.stats)
    stats["scheduler"] = {**dict(engine.counters), **engine.load,
                          "cached_tokens_by_tier": dict(engine.cached_by_tier)}
    return json_response(stats)


async def cache_entries(request: web.Request) -> web.Response:
    store = _store(request)
    offset = query_int(request, "offset", 0, 0, 2**62)
    limit = query_int(request, "limit", 100, 1, 1000)
    sort = request.query.get("sort", "last_used")
    if sort not in SORTS:
        raise bad_request(f"sort must be one of {', '.join(SORTS)}", "sort")
    kind = request.query.get("kind")
    if kind is not None and kind not in KINDS:
        raise bad_request(f"kind must be one of {', '.join(KINDS)}", "kind")
    rows = await blocking(store.entries, offset, limit + 1, sort, kind)
    more = len(rows) > limit
    data = [r.to_dict() for r in rows[:limit]]
    return json_response({"object": "list", "data": data, "offset": offset, "limit": limit,
                          "next_offset": offset + limit if more else None})


def _key(text: str, param: str = "key") -> str:
    if not isinstance(text, str) or len(text) != 32 or \
            any(c not in "0123456789abcdefABCDEF" for c in text):
        raise bad_request(f"{param} must be a cache key: 32 hex digits", param)
    return text.lower()


async def cache_delete(request: web.Request) -> web.Response:
    store = _store(request)
    key = _key(request.match_info["key"])
    n = await blocking(store.delete, key)
    if n == 0:
        raise ApiError(404, f"no cache entry {key}", "key", "entry_not_found")
    return json_response({"key": key, "deleted": n})


async def _pin(request: web.Request, pinned: bool) -> web.Response:
    store = _store(request)
    key = _key(KeyRequest.parse(await read_json(request)).key)
    if await blocking(store.get_info, key) is None:
        raise ApiError(404, f"no cache entry {key}", "key", "entry_not_found")
    n = await blocking(store.pin if pinned else store.unpin, key)
    return json_response({"key": key, "pinned": pinned, "changed": n})


async def cache_pin(request: web.Request) -> web.Response:
    return await _pin(request, True)


async def cache_unpin(request: web.Request) -> web.Response:
    return await _pin(request, False)


async def cache_clear(request: web.Request) -> web.Response:
    store = _store(request)
    raw = await request.read()
    req = ClearRequest.parse(await read_json(request)) if raw.strip() else ClearRequest()
    n = await blocking(store.clear, req.include_pinned)
    return json_response({"deleted": n, "include_pinned": req.include_pinned})

"""The cache page at `/` and the read-only JSON it reads.

    GET /               the page (daemon/http/page/index.html), open like /health: it
    GET /page.js        holds no data; what it shows comes from the routes below
    GET /cache/tiers    what each tier holds now, and the last hour (daemon/history.py)
    GET /cache/tree     the prefix tree's largest branches, the tiers holding them
    GET /cache/requests live requests: prefill progress, rate, ETA
    GET /cache/misses   misses counted by reason, and the latest ones
    GET /cache/pinned   named contexts and pinned prefixes

The /cache/* routes are the admin API's (auth.py): without an admin key (or API key)
they answer anyone, with one the page asks for it. None of them wakes a sleeping
daemon (middleware.py).
"""

from __future__ import annotations

import time
from functools import cache
from pathlib import Path

from aiohttp import web

from ckptd.cache.store.overview import pinned_prefixes, tier_entries
from ckptd.cache.tree import build, largest
from ckptd.daemon.cachefields import timings_cache
from ckptd.daemon.history import sample
from ckptd.daemon.http.common import blocking, json_response, query_int, ready
from ckptd.daemon.service import VERSION, Service

PAGE = Path(__file__).parent / "page"
TREES = web.AppKey("cache_trees", dict)     # limit -> (built at, tree): see _tree
_TREE_FOR_S = 5.0
PREVIEW = 24                 # tokens of a branch or prefix shown as text
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; script-src 'self'; "
            "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
            "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"}


@cache
def _file(name: str) -> bytes:
    return (PAGE / name).read_bytes()


async def page(request: web.Request) -> web.Response:
    return web.Response(body=_file("index.html"), content_type="text/html", charset="utf-8",
                        headers=_HEADERS)


async def script(request: web.Request) -> web.Response:
    return web.Response(body=_file("page.js"), content_type="text/javascript",
                        charset="utf-8", headers=_HEADERS)


async def tiers(request: web.Request) -> web.Response:
    svc = ready(request)
    rt = svc.rt
    return json_response({"server": _server(svc), "now": sample(rt),
                          "period_s": svc.history.period_s, "history": svc.history.list()})


def _server(svc: Service) -> dict:
    rt, cfg = svc.rt, svc.cfg
    return {"model": svc.model_id, "fingerprint": rt.fingerprint[:12], "version": VERSION,
            "started": round(svc.started, 3), "uptime_s": round(time.time() - svc.started, 1),
            "block_size": rt.cache.B, "hybrid": rt.cache.spec.is_hybrid,
            "sleeping": svc.sleeping, "remote": cfg.remote, "max_context": rt.max_context,
            "parallel": cfg.parallel, "max_snapshots": cfg.max_snapshots,
            "snapshot_interval": cfg.snapshot_interval}


async def tree(request: web.Request) -> web.Response:
    svc = ready(request)
    limit = query_int(request, "limit", 60, 1, 500)
    return json_response(await blocking(_tree, svc, limit, request.app[TREES]))


def _tree(svc: Service, limit: int, trees: dict) -> dict:
    """The tree, built from every entry at most every _TREE_FOR_S (pages poll it)."""
    hit = trees.get(limit)
    if hit is not None and time.monotonic() - hit[0] < _TREE_FOR_S:
        return hit[1]
    out = _build_tree(svc, limit)
    trees.clear()
    trees[limit] = (time.monotonic(), out)
    return out


def _build_tree(svc: Service, limit: int) -> dict:
    rt = svc.rt
    entries = tier_entries(rt.store, rt.cache.device.holds)
    nodes = largest(build(entries), limit)
    for n in nodes:
        tokens = n.pop("tokens", None)
        n["preview"] = _text(svc, tokens[:PREVIEW]) if tokens else ""
    return {"entries": len(entries), "stored_bytes": sum(e["stored_bytes"] for e in entries),
            "block_size": rt.cache.B, "nodes": nodes}


def _text(svc: Service, tokens: list[int]) -> str:
    try:
        return svc.tokenizer.decode(tokens)
    except Exception:             # ids another model's vocabulary has: shown as ids
        return " ".join(map(str, tokens))


async def requests(request: web.Request) -> web.Response:
    svc = ready(request)
    return json_response(live_requests(svc.rt.engine, time.perf_counter()))


def live_requests(engine, now: float) -> dict:
    """The running requests (prefill progress, rate, ETA; decode) and how many wait. The
    objects are the engine thread's: read, never written, their ints read whole."""
    out = []
    for live in engine.scheduler.snapshot():
        req, seq, st = live.req, live.seq, live.req.stats
        total, done = len(req.tokens), min(seq.num_computed, len(req.tokens))
        row = {"id": seq.id, "prompt": total, "restored": st.cache_n, "computed": done,
               "generated": st.predicted_n, "max_tokens": req.params.max_tokens,
               "state": "decode" if live.t_decode else "prefill" if live.dec else "admitting",
               "elapsed_s": round(now - req.created, 3), "tokens_per_s": None, "eta_s": None,
               "miss": None}
        if live.dec is not None:                          # admitted: its restore reported
            miss = timings_cache(st)["miss"]
            row["miss"] = None if miss is None else miss["reason"]
        if live.dec is not None and not live.t_decode:
            spent, computed = now - live.t_prefill, done - st.cache_n
            if spent > 0 and computed > 0:
                rate = computed / spent
                row["tokens_per_s"] = round(rate, 1)
                row["eta_s"] = round((total - done) / rate, 2)
        elif live.t_decode and st.predicted_n > 1:
            row["tokens_per_s"] = round((st.predicted_n - 1) / max(1e-9, now - live.t_decode),
                                        1)
        out.append(row)
    return {"running": out, "waiting": engine.scheduler.load["waiting"]}


async def misses(request: web.Request) -> web.Response:
    svc = ready(request)
    return json_response(svc.rt.store.why.stats(recent=True))


async def pinned(request: web.Request) -> web.Response:
    svc = ready(request)
    return json_response(await blocking(_pinned, svc))


def _pinned(svc: Service) -> dict:
    prefixes = pinned_prefixes(svc.rt.store, PREVIEW)
    by_key = {p["key"]: p for p in prefixes}
    for p in prefixes:
        p["text"] = _text(svc, p.pop("last_tokens"))
        p["contexts"] = []
    contexts = []
    for ctx in svc.contexts.all():
        row = ctx.public()
        row["cached"] = ctx.key in by_key or (ctx.key is not None and
                                              svc.rt.store.has(bytes.fromhex(ctx.key)))
        if ctx.key in by_key:
            by_key[ctx.key]["contexts"].append(ctx.name)
        contexts.append(row)
    return {"contexts": contexts, "prefixes": prefixes}


def register(app: web.Application) -> None:
    app[TREES] = {}
    r = app.router
    r.add_get("/", page, allow_head=False)
    r.add_get("/page.js", script, allow_head=False)
    for path, handler in (("/cache/tiers", tiers), ("/cache/tree", tree),
                          ("/cache/requests", requests), ("/cache/misses", misses),
                          ("/cache/pinned", pinned)):
        r.add_get(path, handler, allow_head=False)

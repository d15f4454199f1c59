"""The aiohttp application: routes and middlewares only; handlers do the work."""

from __future__ import annotations

from aiohttp import web

from ckptd.daemon.http import admin, contexts, llama, openai
from ckptd.daemon.http.common import SERVICE
from ckptd.daemon.http.middleware import api_key, errors, observe
from ckptd.daemon.service import Service


def build_app(svc: Service) -> web.Application:
    app = web.Application(client_max_size=svc.cfg.max_body,
                          middlewares=[observe, errors, api_key])
    app[SERVICE] = svc
    r = app.router
    r.add_post("/v1/completions", openai.completions)
    r.add_post("/v1/chat/completions", openai.chat_completions)
    r.add_get("/v1/models", openai.models, allow_head=False)
    r.add_post("/completion", llama.completion)
    r.add_post("/tokenize", llama.tokenize)
    r.add_post("/detokenize", llama.detokenize)
    r.add_get("/health", admin.health, allow_head=False)
    r.add_get("/metrics", admin.metrics, allow_head=False)
    r.add_get("/openapi.json", admin.openapi, allow_head=False)
    r.add_post("/v1/contexts", contexts.create)
    r.add_get("/v1/contexts", contexts.list_all, allow_head=False)
    r.add_get("/v1/contexts/{name}", contexts.get_one, allow_head=False)
    r.add_delete("/v1/contexts/{name}", contexts.delete)
    r.add_get("/cache/stats", admin.cache_stats, allow_head=False)
    r.add_get("/cache/entries", admin.cache_entries, allow_head=False)
    r.add_delete("/cache/entries/{key}", admin.cache_delete)
    r.add_post("/cache/pin", admin.cache_pin)
    r.add_post("/cache/unpin", admin.cache_unpin)
    r.add_post("/cache/clear", admin.cache_clear)
    return app

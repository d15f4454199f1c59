"""The aiohttp application: routes and middlewares only; handlers do the work."""

from __future__ import annotations

import os
from collections.abc import Mapping

from aiohttp import web

from ckptd.daemon.http import (
    adapters,
    admin,
    anthropic,
    cacheview,
    contexts,
    llama,
    openai,
    responses,
    slots,
    vertex,
)
from ckptd.daemon.http.common import SERVICE
from ckptd.daemon.http.errors import not_supported
from ckptd.daemon.http.middleware import api_key, cors, cors_headers, errors, observe, wake
from ckptd.daemon.http.unsupported import UNSUPPORTED
from ckptd.daemon.http.vertex import Vertex
from ckptd.daemon.service import Service


def _unsupported(what: str):
    async def handler(request: web.Request) -> web.Response:
        raise not_supported(what)
    return handler


def build_app(svc: Service, env: Mapping[str, str] = os.environ) -> web.Application:
    app = web.Application(client_max_size=svc.cfg.max_body,
                          middlewares=[observe, errors, cors, api_key, wake])
    app[SERVICE] = svc
    app.on_response_prepare.append(cors_headers)
    r = app.router
    for path in ("/v1/completions",):
        r.add_post(path, openai.completions)
    for path in ("/v1/chat/completions", "/chat/completions"):
        r.add_post(path, openai.chat_completions)
    for path in ("/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"):
        r.add_post(path, openai.chat_input_tokens)
    for path in ("/v1/responses", "/responses"):
        r.add_post(path, responses.responses)
    for path in ("/v1/responses/input_tokens", "/responses/input_tokens"):
        r.add_post(path, responses.input_tokens)
    r.add_post("/v1/messages", anthropic.messages)
    r.add_post("/v1/messages/count_tokens", anthropic.count_tokens)
    for path in ("/v1/models", "/models"):
        r.add_get(path, openai.models, allow_head=False)
    for path in ("/completion", "/completions"):       # llama.cpp's own format
        r.add_post(path, llama.completion)
    r.add_post("/infill", llama.infill)
    r.add_post("/tokenize", llama.tokenize)
    r.add_post("/detokenize", llama.detokenize)
    r.add_post("/apply-template", llama.apply_template)
    r.add_get("/props", llama.props, allow_head=False)
    r.add_get("/lora-adapters", adapters.list_adapters, allow_head=False)
    r.add_post("/lora-adapters", adapters.set_adapters)
    r.add_get("/slots", slots.list_slots, allow_head=False)
    r.add_post("/slots/{id_slot}", slots.action)
    for path in ("/health", "/v1/health"):
        r.add_get(path, admin.health, allow_head=False)
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
    cacheview.register(app)                           # the page at / and what it reads
    for (method, path), what in UNSUPPORTED.items():
        r.add_route(method, path, _unsupported(what))
    vertex.register(app, Vertex.from_env(env), admin.health)
    return app

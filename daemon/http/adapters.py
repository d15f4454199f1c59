"""llama-server's LoRA routes (daemon/lora.py has the rules).

    GET  /lora-adapters   [{"id", "path", "scale", "task_name", "prompt_prefix"}, ...]
    POST /lora-adapters   [{"id": 0, "scale": 0.5}, ...]: the global scales (unnamed: 0)

A generation's own "lora" list overrides the global scales for itself (http/lora.py).
"""

from __future__ import annotations

from aiohttp import web

from ckptd.daemon.http.common import read_json, ready
from ckptd.daemon.http.errors import bad_request
from ckptd.daemon.http.lora import parse_scales


async def list_adapters(request: web.Request) -> web.Response:
    return web.json_response(ready(request).rt.adapters.describe())


async def set_adapters(request: web.Request) -> web.Response:
    svc = ready(request)
    body = await read_json(request)
    if not isinstance(body, list):
        raise bad_request("the body must be a list of {\"id\", \"scale\"} objects", "body",
                          "invalid_type")
    svc.rt.adapters.set_global(parse_scales(body, len(svc.rt.adapters), "body") or {})
    return web.json_response({"success": True})

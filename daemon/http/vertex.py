"""Google Vertex AI's prediction protocol, as llama-server speaks it when a custom
container runs with AIP_MODE=PREDICTION: POST AIP_PREDICT_ROUTE (default /predict)
takes {"instances": [...]}, each naming an endpoint in "@requestFormat" (the route's
camelCase alias, "chatCompletions" for /v1/chat/completions, or its path), and
answers {"predictions": [...]}: each endpoint's JSON answer or error, in order.
AIP_HEALTH_ROUTE adds a health route, AIP_HTTP_PORT sets the port.
https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web

from ckptd.daemon.http.common import BODY, json_response, read_json
from ckptd.daemon.http.errors import ApiError, bad_request

MAX_INSTANCES = 128
log = logging.getLogger("ckptd.http")


@dataclass(frozen=True)
class Vertex:
    """Vertex AI's custom-container settings (AIP_* variables; daemon/http/vertex.py)."""

    enabled: bool = False
    predict_route: str = "/predict"
    health_route: str | None = None
    port: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Vertex:
        if env.get("AIP_MODE") != "PREDICTION":
            return cls()
        port = env.get("AIP_HTTP_PORT")
        if port is not None and not port.isdigit():
            raise ValueError(f"AIP_HTTP_PORT must be a port number, got {port!r}")
        return cls(True, env.get("AIP_PREDICT_ROUTE") or "/predict",
                   env.get("AIP_HEALTH_ROUTE") or None, int(port) if port else None)


def alias(path: str) -> str:
    """A route's @requestFormat name: "/v1/chat/completions" -> "chatCompletions"."""
    s = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    out, cap = [], False
    for c in s.lstrip("/"):
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap else c)
            cap = False
    return "".join(out)


def register(app: web.Application, vertex: Vertex, health) -> None:
    """Add the predict route (after every other route: it dispatches to them)."""
    if not vertex.enabled:
        return
    routes: dict[str, object] = {}
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path")                    # plain routes only: no {parameters}
        if route.method == "POST" and path:
            routes.setdefault(alias(path), route.handler)
            routes.setdefault(path, route.handler)
    if vertex.predict_route in routes:
        raise ValueError(f"AIP_PREDICT_ROUTE={vertex.predict_route} is one of ckptd's routes")

    async def predict(request: web.Request) -> web.Response:
        base = request.clone()                     # before the body is read: clones allowed
        data = await read_json(request)
        instances = data.get("instances") if isinstance(data, dict) else None
        if not isinstance(instances, list):
            raise bad_request("the body must hold an array named instances", "instances")
        if len(instances) > MAX_INSTANCES:
            raise bad_request(f"instances holds at most {MAX_INSTANCES}", "instances")
        preds = await asyncio.gather(*(_one(base, routes, x) for x in instances))
        return json_response({"predictions": list(preds)})

    app.router.add_post(vertex.predict_route, predict)
    if vertex.health_route:
        app.router.add_get(vertex.health_route, health, allow_head=False)


async def _one(base: web.Request, routes: dict, instance: object) -> object:
    if not isinstance(instance, dict) or not isinstance(instance.get("@requestFormat"), str):
        return ApiError(400, "each instance must be an object with a string @requestFormat",
                        "instances").body()
    payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
    payload["stream"] = False                      # one JSON answer per instance
    fmt = instance["@requestFormat"]
    handler = routes.get(fmt)
    if handler is None:
        return ApiError(400, f"no endpoint is named by @requestFormat {fmt!r}",
                        "@requestFormat").body()
    req = base.clone()
    req[BODY] = payload
    try:
        res = await handler(req)
    except ApiError as e:
        return e.body()
    except Exception:                 # one instance's failure is its prediction, not the call's
        log.exception("internal error answering a %s instance", fmt)
        return ApiError(500, "internal server error (see the daemon's log)", None,
                        "internal_error").body()
    return json.loads(res.body) if res.body else None

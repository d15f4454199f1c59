"""Named static contexts: /v1/contexts.

Registering one prefills it once (one generated token, discarded), which leaves
its blocks and an end-of-prompt snapshot in the cache, then pins the entry that
ends it (pinning covers its ancestors), so eviction never drops it. Later
requests name it with `"context": name` and send only their own suffix.
"""

from __future__ import annotations

from aiohttp import web

from ckptd.daemon.contexts import Context
from ckptd.daemon.generation import failure
from ckptd.daemon.http.common import blocking, json_response, read_json, ready, service
from ckptd.daemon.http.errors import ApiError
from ckptd.daemon.http.schemas import ContextRequest
from ckptd.daemon.prompt import Prompt
from ckptd.model.sampling.sampler import SamplingParams


def prefix_key(store, tokens: list[int], salt: str | None) -> str | None:
    """Hex key of the cache entry that ends exactly at `tokens`, if it is cached."""
    plan = store.lookup(tokens, salt)
    if plan.position != len(tokens):
        return None
    piece = plan.snapshot or (plan.blocks[-1] if plan.blocks else None)
    return None if piece is None else piece.key.hex()


async def create(request: web.Request) -> web.Response:
    svc = ready(request)
    req = ContextRequest.parse(await read_json(request))
    taken = svc.contexts.get(req.name)
    if taken is not None and taken.salt is not None and not taken.visible_to(req.salt):
        # Replacing it would swap the text under another tenant's requests.
        raise ApiError(409, f"context {req.name!r} was registered under another cache_salt",
                       "name", "context_exists")
    ctx = Context(req.name, req.text, req.messages, req.salt, req.pin)
    tokens = await blocking(svc.prompts.context_tokens, ctx)
    params = svc.fit_to_context(tokens, 1, SamplingParams(max_tokens=1),
                        "text" if req.text is not None else "messages")
    # requests naming it part at its end, where its end-of-prompt snapshot is: no tails
    gen = svc.generation(tokens, params, req.salt, True, prompt=Prompt(tokens, req.salt,
                                                                       tails=False))
    try:
        res = await gen.collect()
    finally:
        gen.close()
    err = failure(res.finished)
    if err is not None:
        raise err
    ctx.tokens = len(tokens)
    # its state was computed with the global LoRA scales: keyed under their salt
    key_salt = svc.rt.adapters.salt(req.salt, gen.req.lora)
    ctx.key = await blocking(prefix_key, svc.rt.store, tokens, key_salt)
    if req.pin and ctx.key:
        await blocking(svc.rt.store.pin, ctx.key)
        info = await blocking(svc.rt.store.get_info, ctx.key)
        ctx.pinned = bool(info and info.pinned)
    else:
        ctx.pinned = False
    old = svc.contexts.get(req.name)
    if old is not None and old.pinned and old.key and (old.key != ctx.key or not ctx.pinned):
        await blocking(svc.rt.store.unpin, old.key)
    await blocking(svc.contexts.put, ctx)
    stats = res.finished.stats
    return json_response({**ctx.public(), "cached_tokens": stats.cache_n,
                          "timings": stats.timings()}, 200 if old is not None else 201)


def _salt(request: web.Request) -> str | None:
    """The tenant asking (?cache_salt=): a salted context is listed, shown and deleted
    only for its own salt, and is unknown to everyone else."""
    salt = request.query.get("cache_salt")
    if salt is not None and len(salt) > 256:
        raise ApiError(400, "cache_salt is at most 256 characters", "cache_salt")
    return salt or None


async def list_all(request: web.Request) -> web.Response:
    svc = service(request)
    salt = _salt(request)
    return json_response({"object": "list", "data": [
        c.public() for c in svc.contexts.all() if c.visible_to(salt)]})


async def get_one(request: web.Request) -> web.Response:
    svc = service(request)
    return json_response(svc.context(request.match_info["name"], _salt(request),
                                     param="name").public())


async def delete(request: web.Request) -> web.Response:
    svc = ready(request)
    name = request.match_info["name"]
    svc.context(name, _salt(request), param="name")   # 404 when unknown to this tenant
    ctx = await blocking(svc.contexts.delete, name)
    if ctx is None:
        raise ApiError(404, f"no context named {name!r}", "context", "context_not_found")
    if ctx.pinned and ctx.key:
        await blocking(svc.rt.store.unpin, ctx.key)
    return json_response({"name": name, "object": "context", "deleted": True})

"""llama-server's slots: GET /slots, POST /slots/{id}?action=save|restore|erase.

A slot is one of the `--parallel` sequences the engine runs; it remembers the last
sequence that ran in it. Its state itself lives in the cache (a finished sequence's
final checkpoint), so save writes that state to a file under --slot-save-path
(cache/slotfile.py: the store's codec, checksum and weights fingerprint) and
restore puts a file's state back into the cache, where the next request starting
with those tokens finds it. Erase makes the slot forget its sequence; the cached
entries stay, shared as every entry is (/cache/* manages them).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from aiohttp import web

from ckptd.cache import slotfile
from ckptd.daemon.http.common import blocking, json_response, read_json, ready
from ckptd.daemon.http.errors import ApiError, bad_request, not_supported
from ckptd.daemon.http.fields import Fields
from ckptd.daemon.service import Service

ACTIONS = ("save", "restore", "erase")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


async def list_slots(request: web.Request) -> web.Response:
    svc = ready(request)
    if not svc.cfg.slots:
        raise not_supported("the /slots endpoint (this server runs with --no-slots)")
    engine = svc.rt.engine
    out = [{"id": v.id, "n_ctx": svc.max_context, "is_processing": v.processing,
            "id_task": v.task, "n_cached": v.n_cached,
            "next_token": [{"n_decoded": v.n_decoded, "n_remain": v.n_remain}]}
           for v in engine.slots.view(engine.scheduler.snapshot(), svc.cfg.parallel)]
    return web.json_response(out)


def _slot_id(request: web.Request, svc: Service) -> int:
    raw = request.match_info["id_slot"]
    if not raw.isdigit() or int(raw) >= svc.cfg.parallel:
        raise bad_request(f"id_slot must be a slot id in 0..{svc.cfg.parallel - 1}, got "
                          f"{raw!r}", "id_slot")
    return int(raw)


def _file(svc: Service, name: object) -> Path:
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise bad_request("filename must be a plain file name (letters, digits, '_', '.', "
                          "'-'; no folders)", "filename")
    return Path(svc.cfg.slot_save_path) / name


async def action(request: web.Request) -> web.Response:
    svc = ready(request)
    slot = _slot_id(request, svc)
    act = request.query.get("action")
    if act not in ACTIONS:
        raise bad_request(f"action must be one of {', '.join(ACTIONS)}", "action")
    engine = svc.rt.engine
    if act == "erase":
        last = engine.slots.forget(slot)
        return json_response({"id_slot": slot, "n_erased": len(last[0]) if last else 0})
    if svc.cfg.slot_save_path is None:
        raise not_supported("slot save and restore without --slot-save-path")
    path = _file(svc, Fields(await read_json(request)).data.get("filename"))
    t0 = time.perf_counter()
    if act == "save":
        last = engine.slots.last(slot)
        if last is None:
            raise ApiError(409, f"slot {slot} holds no sequence to save", "id_slot",
                           "slot_empty")
        try:
            n = await blocking(slotfile.save, svc.rt.store, last[0], last[1], path, last[2])
        except slotfile.SlotStateError as e:
            raise ApiError(409, str(e), "id_slot", "state_not_cached") from None
        return json_response({"id_slot": slot, "filename": path.name, "n_saved": n,
                              "n_written": path.stat().st_size,
                              "timings": {"save_ms": (time.perf_counter() - t0) * 1000}})
    if not path.is_file():
        raise ApiError(404, f"no saved slot file {path.name!r}", "filename", "file_not_found")
    try:
        tokens, salt, images = await blocking(slotfile.restore, svc.rt.store, path,
                                              svc.vision)
    except slotfile.SlotStateError as e:
        raise bad_request(str(e), "filename", "invalid_slot_file") from None
    engine.slots.remember(slot, tokens, salt, images)
    return json_response({"id_slot": slot, "filename": path.name, "n_restored": len(tokens),
                          "n_read": path.stat().st_size,
                          "timings": {"restore_ms": (time.perf_counter() - t0) * 1000}})

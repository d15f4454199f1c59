"""LoRA scales as requests give them: a generation's `lora` field and POST
/lora-adapters' body, both [{"id": 0, "scale": 0.5}, ...] (daemon/lora.py has the rules;
http/adapters.py the routes)."""

from __future__ import annotations

import math

from ckptd.daemon.http.errors import bad_request
from ckptd.daemon.http.fields import type_error


def parse_scales(raw: object, n_adapters: int, name: str = "lora") -> dict[int, float] | None:
    """{id: scale} from a list of {"id", "scale"} objects; None for null or []. A bad
    entry is a 400 naming it (lora[1].id). A missing scale is 0, as llama-server reads it."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise type_error(name, "a list of {\"id\", \"scale\"} objects", raw)
    out: dict[int, float] = {}
    for i, entry in enumerate(raw):
        where = f"{name}[{i}]"
        if not isinstance(entry, dict):
            raise type_error(where, "an object with id and scale", entry)
        aid, scale = entry.get("id"), entry.get("scale", 0.0)
        if not isinstance(aid, int) or isinstance(aid, bool):
            raise type_error(f"{where}.id", "an integer", aid)
        if not 0 <= aid < n_adapters:
            raise bad_request(f"{where}.id: no LoRA adapter has id {aid} ({n_adapters} "
                              "loaded, ids from 0; GET /lora-adapters lists them)",
                              f"{where}.id")
        if not isinstance(scale, (int, float)) or isinstance(scale, bool):
            raise type_error(f"{where}.scale", "a number", scale)
        if not math.isfinite(scale):
            raise bad_request(f"{where}.scale must be finite", f"{where}.scale")
        out[aid] = float(scale)
    return out or None


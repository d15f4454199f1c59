"""The cache tiers over time, for the page at `/`: a sample every few seconds of what
each tier holds and of the engine's cumulative counters (prompt tokens, restored
tokens by tier, restores and misses), the last hour kept. The page draws bytes per
tier and the hit rate of each interval (restored / prompt tokens between two samples)
from them. A sample reads counters only: no walk over the index, no lock waited on
for long, so it costs nothing to a busy daemon.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

PERIOD_S = 5.0
KEEP = 720               # an hour at PERIOD_S


def sample(rt) -> dict:
    """What the tiers hold now and the counters so far (rt: a loaded Runtime)."""
    store, device, engine = rt.store, rt.cache.device, rt.engine
    page = rt.cache.spec.page_bytes()
    used = device.num_pages - device.num_free
    index = store.catalog.index
    tiers = {
        "device": {"bytes": used * page, "budget": device.num_pages * page,
                   "entries": device.num_registered},
        "host": {"bytes": store.host.bytes, "budget": store.host.budget,
                 "entries": len(store.host.items)},
        "disk": {"bytes": index.stored_bytes, "budget": store.budget, "entries": len(index)},
    }
    if store.remote is not None:
        client = store.remote.client
        tiers["remote"] = {"bytes_down": client.bytes_down, "bytes_up": client.bytes_up}
    c, why = engine.counters, store.why
    return {"t": round(time.time(), 3), "tiers": tiers,
            "prompt_tokens": c["prompt_tokens"], "cached_tokens": c["cached_tokens"],
            "cached_by_tier": dict(engine.cached_by_tier),
            "restores": why.restores, "complete": why.complete}


class TierHistory:
    def __init__(self, period_s: float = PERIOD_S, keep: int = KEEP) -> None:
        self.period_s = period_s
        self.samples: deque[dict] = deque(maxlen=keep)

    def take(self, rt) -> dict:
        rt.store.why.resolve_all()      # the misses filed meanwhile: counted and logged
        s = sample(rt)
        self.samples.append(s)
        return s

    def list(self) -> list[dict]:
        return list(self.samples)

    async def run(self, rt) -> None:
        """Until cancelled: a sample every period_s (on the event loop: it only reads)."""
        while True:
            self.take(rt)
            await asyncio.sleep(self.period_s)

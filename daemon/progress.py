"""Progress of long prefills, as INFO log lines: a 250K-token context takes minutes to
compute the first time, and the log says how far it is and when it will be done.

    prefill #12: 61,440 / 250,479 tokens (24.5%), 1,024 restored, 612 tok/s, ETA 5m 9s
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ckptd.daemon.request import Live

log = logging.getLogger("ckptd")
EVERY_S = 5.0           # a line per long prefill at most this often
LONG = 4096             # tokens to compute from which a prefill is logged


@dataclass
class _Seen:
    start: float
    computed: int         # tokens in its state when first seen
    logged: float


class PrefillLog:
    def __init__(self, every_s: float = EVERY_S, long: int = LONG) -> None:
        self.every_s, self.long = every_s, long
        self.seen: dict[int, _Seen] = {}

    def update(self, running: list[Live], now: float | None = None) -> None:
        """After a step: a line for each long prefill not logged for every_s seconds."""
        now = time.perf_counter() if now is None else now
        alive = set()
        for live in running:
            seq, st = live.seq, live.req.stats
            todo = len(live.req.tokens) - st.cache_n
            if live.t_decode or live.dec is None or todo < self.long:
                continue
            alive.add(seq.id)
            seen = self.seen.get(seq.id)
            if seen is None:
                self.seen[seq.id] = _Seen(now, seq.num_computed, now)
                continue
            if now - seen.logged >= self.every_s:
                seen.logged = now
                log.info("%s", line(seq.id, seq.num_computed, len(live.req.tokens),
                                    st.cache_n, seq.num_computed - seen.computed,
                                    now - seen.start))
        for sid in [s for s in self.seen if s not in alive]:
            del self.seen[sid]


def line(sid: int, done: int, total: int, restored: int, computed: int,
         seconds: float) -> str:
    rate = computed / seconds if seconds > 0 else 0.0
    eta = (total - done) / rate if rate > 0 else None
    return (f"prefill #{sid}: {done:,} / {total:,} tokens ({100 * done / total:.1f}%), "
            f"{restored:,} restored, {rate:,.0f} tok/s, ETA {duration(eta)}")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    return f"{s // 3600}h {s % 3600 // 60}m"

"""llama-server's slots as the engine keeps them: each of the `--parallel` sequences
running, and the last sequence that ran in each one (what /slots/{id}?action=save
writes). The engine's thread records a finished sequence; HTTP handlers read, erase
and restore on the event loop's thread: every access holds the lock."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ckptd.daemon.request import Live


@dataclass(frozen=True)
class SlotView:
    """One slot at one moment, copied out of the engine's objects."""
    id: int
    processing: bool
    n_cached: int                 # tokens of the last sequence that ran here
    n_decoded: int
    n_remain: int                 # -1 when idle
    task: int                     # the running request's id, -1 when idle


class Slots:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        # slot -> (tokens, salt, image spans among the tokens)
        self._last: dict[int, tuple[list[int], str | None, tuple]] = {}

    def remember(self, slot: int, tokens: list[int], salt: str | bytes | None,
                 images: tuple = ()) -> None:
        with self.lock:
            self._last[slot] = (tokens, salt, images)

    def last(self, slot: int) -> tuple[list[int], str | None, tuple] | None:
        with self.lock:
            return self._last.get(slot)

    def forget(self, slot: int) -> tuple[list[int], str | None, tuple] | None:
        with self.lock:
            return self._last.pop(slot, None)

    def view(self, running: list[Live], count: int) -> list[SlotView]:
        """Every slot; `running` is the scheduler's copy (Scheduler.snapshot)."""
        by_slot = {live.slot: live for live in running}
        out = []
        with self.lock:
            for i in range(count):
                live, last = by_slot.get(i), self._last.get(i)
                cached = len(last[0]) if last else 0
                if live is None:
                    out.append(SlotView(i, False, cached, 0, -1, -1))
                    continue
                dec = live.dec
                done = 0 if dec is None else dec.n
                out.append(SlotView(i, True, cached, done, live.req.params.max_tokens - done,
                                    id(live.req) % 2**31))
        return out

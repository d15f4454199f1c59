"""The restores' reports, kept for /metrics and the page: misses counted by reason
(with the prompt tokens each reason left to compute), the latest reports, and the
salt of each root seen (explain.py tells another tenant from another adapter set by
it). One INFO line per restore says what came from where and why not more:

    cache #7: 6,144 / 6,200 tokens restored (device 4,096, disk 2,048) in 3.1 ms;
        miss at 6,144: thinned: the snapshot at 8,192 was thinned ... 95 s ago
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict, deque

from ckptd.cache.keys import KeyChain
from ckptd.cache.why.explain import Attempt, View, explain
from ckptd.cache.why.gone import Gone
from ckptd.cache.why.report import REASONS, CacheReport

log = logging.getLogger("ckptd.cache")
RECENT = 100           # reports kept for the page
SALTS = 4096           # roots whose salt is remembered


class Ledger:
    def __init__(self, view: View, gone: Gone, fingerprint: str | None) -> None:
        self.view, self.gone, self.fp = view, gone, fingerprint
        self.lock = threading.Lock()
        self.restores = 0                      # reports made
        self.complete = 0                      # of them, with nothing missed
        self.misses: Counter[str] = Counter()  # by reason
        self.missed_tokens: Counter[str] = Counter()   # tokens computed after the miss
        self.recent: deque[dict] = deque(maxlen=RECENT)
        self.salts: OrderedDict[bytes, str | bytes | None] = OrderedDict()

    def report(self, seq_id: int, tokens: list[int], salt: str | bytes | None,
               chain: KeyChain, attempt: Attempt, runs: list[tuple[str, int, int]],
               restore_ms: float) -> CacheReport:
        """Explain one restore (the engine's thread), count it and log it."""
        salts = self.salts
        salts[chain.root] = salt              # a root is one salt: this only refreshes it
        salts.move_to_end(chain.root)
        if len(salts) > SALTS:
            salts.popitem(last=False)
        miss = explain(tokens, chain, attempt, self.view, self.gone, salts, self.fp)
        rep = CacheReport(len(tokens), attempt.restored, runs, miss, restore_ms)
        with self.lock:
            self.restores += 1
            if miss is None:
                self.complete += 1
            else:
                self.misses[miss.reason] += 1
                self.missed_tokens[miss.reason] += len(tokens) - attempt.restored
                self.recent.append({"at": round(time.time(), 3), "request": seq_id,
                                    "salted": salt is not None, **rep.to_dict()})
        if log.isEnabledFor(logging.INFO):
            log.info("cache #%d: %s", seq_id, rep.line())
        return rep

    def stats(self, recent: bool = False) -> dict:
        """Counts by reason (every reason, zeros too); with recent, the latest misses,
        newest first."""
        with self.lock:
            out = {"restores": self.restores, "complete": self.complete,
                   "by_reason": {r: self.misses.get(r, 0) for r in REASONS},
                   "tokens_by_reason": {r: self.missed_tokens.get(r, 0) for r in REASONS}}
            if recent:
                out["recent"] = list(reversed(self.recent))
            return out

"""The restores' reports, kept for /metrics and the page: misses counted by reason
(with the prompt tokens each reason left to compute), the latest reports, and the
salt of each root seen (explain.py tells another tenant from another adapter set by
it). One INFO line per restore says what came from where and why not more:

    cache #7: 6,144 / 6,200 tokens restored (device 4,096, disk 2,048) in 3.1 ms;
        miss at 6,144: thinned: the snapshot at 8,192 was thinned ... 95 s ago

The engine's thread only files a report (what the restore saw, and when); a miss is
explained when the report is first read: by the responder, a /metrics scrape, the
page, or the daemon's sampler every few seconds (which also writes the log lines).
So admission pays a few object allocations, not the explanation: it is explained as
of the restore (explain.py ignores what departed or was cached after it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque

from ckptd.cache.keys import KeyChain
from ckptd.cache.why.explain import Attempt, View, explain
from ckptd.cache.why.gone import Gone
from ckptd.cache.why.report import REASONS, CacheReport

log = logging.getLogger("ckptd.cache")
RECENT = 100           # misses kept for the page
SALTS = 4096           # roots whose salt is remembered
PENDING = 1024         # reports waiting to be explained; past this the oldest are now


class Ledger:
    def __init__(self, view: View, gone: Gone, fingerprint: str | None) -> None:
        self.view, self.gone, self.fp = view, gone, fingerprint
        self.lock = threading.Lock()           # the counts and the queue: held briefly
        # One explanation at a time (it takes the catalog's and the records' locks, so
        # it is never taken under those); the engine's thread does not wait for it.
        self.explaining = threading.Lock()
        self.restores = 0                      # reports filed
        self.complete = 0                      # of them, with nothing missed
        self.misses: Counter[str] = Counter()  # by reason
        self.missed_tokens: Counter[str] = Counter()   # tokens computed after the miss
        self.recent: deque[tuple] = deque(maxlen=RECENT)   # (time, request, salted, report)
        self.pending: deque[CacheReport] = deque()
        self.salts: dict[bytes, str | bytes | None] = {}

    def report(self, seq_id: int, tokens: list[int], salt: str | bytes | None,
               chain: KeyChain, attempt: Attempt, runs: list[tuple[str, int, int]],
               restore_ms: float) -> CacheReport:
        """File one restore's report (the engine's thread): counted now, explained later."""
        attempt.at, attempt.prompt = time.time(), len(tokens)
        rep = CacheReport(len(tokens), attempt.restored, runs, restore_ms)
        with self.lock:
            self.restores += 1
            if attempt.restored >= len(tokens) - 1:
                self.complete += 1
                late = None
            else:
                rep.pending = (self, seq_id, tokens, salt, chain, attempt)
                self.pending.append(rep)
                late = self.pending.popleft() if len(self.pending) > PENDING else None
        if late is not None:
            self.resolve(late)
        elif rep.pending is None and log.isEnabledFor(logging.INFO):
            log.info("cache #%d: %s", seq_id, rep.line())
        return rep

    def resolve(self, rep: CacheReport) -> None:
        """Explain a report (once), count its miss, log it."""
        with self.explaining:
            if rep.pending is None:
                return
            _, seq_id, tokens, salt, chain, attempt = rep.pending
            salts = self.salts
            if chain.root not in salts:        # a root is one salt
                if len(salts) >= SALTS:
                    salts.clear()              # seen again, they come back
                salts[chain.root] = salt
            miss = explain(tokens, chain, attempt, self.view, self.gone, salts, self.fp)
            with self.lock:
                rep.explained, rep.pending = miss, None
                if miss is not None:
                    self.misses[miss.reason] += 1
                    self.missed_tokens[miss.reason] += rep.prompt - rep.restored
                    self.recent.append((attempt.at, seq_id, salt is not None, rep))
        if log.isEnabledFor(logging.INFO):
            log.info("cache #%d: %s", seq_id, rep.line())

    def resolve_all(self) -> None:
        while True:
            with self.lock:
                if not self.pending:
                    return
                rep = self.pending.popleft()
            self.resolve(rep)

    def stats(self, recent: bool = False) -> dict:
        """Counts by reason (every reason, zeros too); with recent, the latest misses,
        newest first."""
        self.resolve_all()
        with self.lock:
            out = {"restores": self.restores, "complete": self.complete,
                   "by_reason": {r: self.misses.get(r, 0) for r in REASONS},
                   "tokens_by_reason": {r: self.missed_tokens.get(r, 0) for r in REASONS}}
            latest = list(reversed(self.recent)) if recent else None
        if latest is not None:
            out["recent"] = [{"at": round(t, 3), "request": rid, "salted": salted,
                              **rep.to_dict()} for t, rid, salted, rep in latest]
        return out

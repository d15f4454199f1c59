"""Long prefills log their progress: tokens done of the total, rate, ETA, restored."""

from __future__ import annotations

import logging

from ckptd.daemon.progress import PrefillLog, duration
from ckptd.daemon.request import Live, Request
from ckptd.model.sampling.decoding import Decoding
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.sequence import Sequence
from ckptd.model.text.tokenizer import load_tokenizer


def _live(tokenizer, n: int, restored: int) -> Live:
    req = Request(list(range(n)), SamplingParams(), lambda ev: None)
    req.stats.cache_n = restored
    seq = Sequence(list(req.tokens))
    seq.num_computed = restored
    return Live(req, seq, dec=Decoding(tokenizer, req.params))


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_long_prefill_logs_its_progress_every_few_seconds(tiny_hybrid_dir):
    tok = load_tokenizer(tiny_hybrid_dir)
    long, short = _live(tok, 250_000, 1024), _live(tok, 2000, 0)
    log = PrefillLog(every_s=5.0)
    logger, handler = logging.getLogger("ckptd"), Lines()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        log.update([long, short], now=100.0)          # first seen: the clock starts
        long.seq.num_computed += 6000
        log.update([long, short], now=102.0)          # too soon for a line
        long.seq.num_computed += 9000
        log.update([long, short], now=110.0)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    lines = handler.lines
    assert len(lines) == 1
    assert lines[0] == (f"prefill #{long.seq.id}: 16,024 / 250,000 tokens (6.4%), 1,024 "
                        "restored, 1,500 tok/s, ETA 2m 36s")
    long.t_decode = 1.0                               # done: forgotten
    log.update([long], now=200.0)
    assert log.seen == {}


def test_durations_read_like_a_person_writes_them():
    assert [duration(s) for s in (None, 4.4, 75, 3 * 3600 + 125)] == \
        ["unknown", "4 s", "1m 15s", "3h 2m"]

"""Console progress (rich) for a person watching the daemon: model loading, long prefills.

Shown only when stderr is a terminal; logs carry the same facts for everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

LONG_PREFILL = 4096      # uncached prompt tokens that earn a progress bar


class ConsoleProgress:
    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.console = Console(stderr=True)

    @contextlib.contextmanager
    def loading(self, what: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=self.console, transient=True) as bar:
            bar.add_task(f"loading {what}", total=None)
            yield

    async def watch_prefills(self, scheduler, period: float = 0.5) -> None:
        """Until cancelled: a bar per long prefill running in the scheduler."""
        if not self.enabled:
            return
        bars = Progress(TextColumn("prefill #{task.fields[seq]}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=self.console)
        tasks: dict[int, int] = {}
        with bars:
            while True:
                live_ids = set()
                for live in scheduler.snapshot():
                    seq = live.seq
                    todo = len(live.req.tokens) - live.req.stats.cache_n
                    if live.t_decode or todo < LONG_PREFILL:
                        continue
                    live_ids.add(seq.id)
                    if seq.id not in tasks:
                        tasks[seq.id] = bars.add_task("", total=len(live.req.tokens),
                                                      seq=seq.id)
                    bars.update(tasks[seq.id], completed=seq.num_computed)
                for sid in [s for s in tasks if s not in live_ids]:
                    bars.remove_task(tasks.pop(sid))
                await asyncio.sleep(period)

"""States left naming a segment that a reader found corrupt (and deleted) or gone.

The reader deletes the state it read; other states of the same cell may name the same
segment (an interval snapshot below the one read, a state another daemon cut the same
way). A daemon that computes the prefix again puts a segment of the same name only
when it cuts its chain the same way, so without this they would dangle until
`inspect --remote verify --drop` or gc: every state listed in the cells that can name
the segment whose head names it is deleted with it. The cells: the one of the state
that was read (a segment that ends a chain mid-cell is named only by states of its
own cell) and the one the segment starts (its first block's parent: a whole cell's).
"""

from __future__ import annotations

import logging

from ckptd.cache import codec
from ckptd.cache.remote import state
from ckptd.cache.remote.client import RemoteClient, RemoteError
from ckptd.cache.remote.layout import SEGMENT, STATE, Layout

log = logging.getLogger(__name__)


def sweep(client: RemoteClient, layout: Layout, owner: str, segments: set[str]
          ) -> list[state.StateHead]:
    """Delete the states of the cells that can name `segments` whose heads name one
    of them; owner: the state that named them (read by a restore). Returns the heads
    of those deleted (their departures: lost.py). Best effort: a remote that fails
    leaves the rest to the next reader."""
    cells = set()
    for name in {owner, *segments}:
        parsed = layout.parse(name)
        if parsed is not None and parsed[0] in (STATE, SEGMENT):
            cells.add(parsed[1])
    doomed = []
    try:
        for cell in sorted(cells):
            for o in client.list(layout.states_of(cell)):
                try:
                    head = state.fetch_head(client.get_range, o.name, o.size, layout.fp,
                                            layout.absolute)
                except codec.CorruptValue:
                    continue                   # the finder deletes a bad head it reads
                if head is not None and any(s.name in segments for s in head.segments):
                    doomed.append((o.name, head))
        if doomed:
            client.delete([name for name, _ in doomed])
    except RemoteError as e:
        log.warning("remote: states naming %s not all deleted: %s", sorted(segments), e)
        return []
    if doomed:
        log.warning("remote: deleted %d states naming %s", len(doomed), sorted(segments))
    return [head for _, head in doomed]

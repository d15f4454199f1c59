"""What the remote tier lost, as one daemon sees it: departures for cache/why/.

A daemon learns that a remote object is gone only by reading it: a restore's fetch
finds a value corrupt (the object holding it is deleted, fetch.py) or an object not
there (gc deleted it, or another daemon found it corrupt); the state that named
it is deleted then, with the other states of its cells that name it (sweep.py); a
lookup finds a state's head corrupt and deletes it (finder.py). Each entry that went
with them is recorded (reason, the remote tier, when), so that a later request that
would have restored it is told why the remote did not serve it. The request whose
restore failed says so itself (cache/why/explain.py: the restore's own failure).

Not seen, so not recorded: objects that gc (`ckptd inspect --remote gc`, `verify
--drop`) or another daemon deleted and that this daemon never went on to read. The
remote has no record of its deletions, and asking it on every miss would cost
requests; such a prefix reads as never stored there (or by the local tiers' own
departures).
"""

from __future__ import annotations

from ckptd.cache.entry import SNAPSHOT, EntryMeta
from ckptd.cache.lookup import REMOTE
from ckptd.cache.remote.fetch import Lost
from ckptd.cache.remote.ranges import CORRUPT, MISSING
from ckptd.cache.why import gone as departures

_WHY = {CORRUPT: "its object held a corrupt value; deleted from the bucket",
        MISSING: "its object was gone from the bucket (gc, or another daemon deleted it)"}
_NAMED = {CORRUPT: "it named an object that held a corrupt value; deleted",
          MISSING: "it named an object gone from the bucket (gc, or another daemon); "
                   "deleted"}
BAD_HEAD = "its state object's head failed verification; deleted"


def record(gone: departures.Gone, lost: Lost, where: dict, metas: dict[bytes, EntryMeta],
           kept: set[bytes], fingerprint: str) -> None:
    """Departures for a fetch's losses. where: key -> Loc of every entry the lookup
    found (finder.Found.where); metas: their metas; kept: keys the restore kept
    locally (not lost to this daemon)."""
    by_reason: dict[str, list] = {CORRUPT: [], MISSING: []}
    for key, loc in where.items():
        why = lost.objects.get(loc.name)
        if why is not None and key not in kept:
            by_reason[why].append((key, metas[key]))
    for why, items in by_reason.items():
        gone.left(items, departures.CORRUPT if why == CORRUPT else departures.EVICTED,
                  REMOTE, _WHY[why])
    states = [(key, metas[key]) for key, loc in where.items()
              if loc.name == lost.owner and loc.name not in lost.objects and key not in kept]
    states += [(h.key, EntryMeta(SNAPSHOT, h.parent, h.position, list(h.tokens), fingerprint))
               for h in lost.swept]
    cause = lost.cause
    gone.left(states, departures.CORRUPT if cause == CORRUPT else departures.EVICTED, REMOTE,
              _NAMED[cause])

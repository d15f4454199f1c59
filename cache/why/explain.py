"""Why a restore stopped where it did: one pure function over what the restore saw,
the index, and the records of departed entries (cache/why/gone.py).

In order, the first that holds:

1. the restore's own trouble: a planned piece failed verification (corrupt) or could
   not be read (tier_fault), and the state below it was restored instead;
2. the planner found more but chose to compute it (cost): reading was estimated
   slower than computing;
3. cached entries go on past the restored position (`shared`), but no state to start
   from lies between: a snapshot there departed (thinned, evicted, refused...), or a
   remote state further on (lost by the remote: cache/remote/lost.py), or there never
   was one (no_snapshot: a recurrent state can't be cut);
4. nothing cached continues the prompt: the entry that would have departed (evicted,
   thinned, corrupt, deleted, budget; from the device too), a remote state further
   on the path that departed, or the prompt is cached further under another
   root (other_model, other_salt, other_adapters: the deepest block it matches there),
   else unseen.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ckptd.cache.entry import EntryMeta
from ckptd.cache.keys import KeyChain, keys_under
from ckptd.cache.lookup import DEVICE, REMOTE
from ckptd.cache.why.gone import BUDGET, CORRUPT, DELETED, EVICTED, THINNED, Departure, Gone
from ckptd.cache.why.report import (
    COST,
    NO_SNAPSHOT,
    OTHER_ADAPTERS,
    OTHER_MODEL,
    OTHER_SALT,
    UNSEEN,
    Miss,
    ago,
)

_UNSEEN = ("nothing cached continues the prompt here: not seen before (or gone before its "
           "departure was recorded)")
_PATH_DEPTHS = 1 << 14     # block depths searched for a departed snapshot (a 256K prompt's)
_SHORT_SCAN = 64           # entries after another root compared with a prompt under a block
_OTHER_ROOTS = 4           # other roots holding the prompt's first block searched deeper
_UNKNOWN = object()


class View(Protocol):
    """What explaining reads of the store (cache/store/catalog.py)."""

    def find_many(self, keys: Sequence[bytes]) -> list[tuple[EntryMeta, str] | None]: ...

    def children_after(self, parent: bytes) -> list[tuple[bytes, EntryMeta, str]]: ...

    def roots(self) -> list[bytes]:
        """The root keys (model, block size, salt) some stored entry hangs from."""
        ...


class Declined(NamedTuple):
    """A plan the planner did not take: reading it was estimated slower than computing."""
    position: int
    tier: str
    nbytes: int
    read_s: float
    compute_s: float


class Failed(NamedTuple):
    """The first plan a restore could not load."""
    position: int
    reason: str            # CORRUPT or TIER_FAULT
    tier: str


@dataclass(slots=True)
class Attempt:
    """What one restore saw."""
    restored: int                      # tokens restored
    shared: int = 0                    # prompt tokens that cached entries share
    declined: Declined | None = None
    failed: Failed | None = None
    at: float = 0.0                    # when (unix time; 0: now): later departures, and
    #                                    entries made later, are not why it missed
    prompt: int = 0                    # the prompt's tokens (0: all the tokens given)


def is_adapter_salt(salt: str | bytes | None) -> bool:
    """An adapter set's salt: bytes starting 0xFF, which no text salt encodes to
    (daemon/lora.py)."""
    return isinstance(salt, bytes) and salt[:1] == b"\xff"


def explain(tokens: list[int], chain: KeyChain, a: Attempt, view: View, gone: Gone,
            salts: Mapping[bytes, str | bytes | None], fingerprint: str) -> Miss | None:
    """Why tokens[a.restored] was not restored; None when nothing was missed. tokens: the
    prompt's first (a sequence's list, which its answer may have grown since, as its
    chain; a.prompt says how many are the prompt); salts: the salt of each root seen
    (chain.root's included); fingerprint: this model's. Explained as of a.at: what
    departed or was cached after it does not count."""
    n, P, B = a.prompt or len(tokens), a.restored, chain.block_size
    if P >= n - 1:
        return None
    now = a.at or time.time()
    f = a.failed
    if f is not None and f.position > P:
        what = ("a stored entry failed verification and was dropped" if f.reason == CORRUPT
                else f"the {f.tier} tier could not serve a planned piece (read error, gone "
                     "meanwhile, or late)")
        return Miss(P, f.reason, f.tier, recomputed=f.position - P,
                    detail=f"restore failed: {what}; restored {P:,} instead of "
                           f"{f.position:,} and recomputed the rest")
    d = a.declined
    if d is not None and d.position > P:
        return Miss(P, COST, d.tier, recomputed=d.position - P,
                    detail=f"reading {_size(d.nbytes)} from {d.tier} (~{d.read_s * 1000:.0f} ms) "
                           f"was estimated slower than computing {_tokens(d.position - P)} "
                           f"(~{d.compute_s * 1000:.0f} ms)")
    S = min(a.shared, n)
    if S > P:
        rec = _lost_on_path(tokens, n, chain, P, min(S // B, n // B), gone, now) \
            or _lost_on_path(tokens, n, chain, P, n // B, gone, now, REMOTE)
        if rec is not None:
            return _departed(P, rec, now, rec.position - P, _state(rec))
        return Miss(P, NO_SNAPSHOT, recomputed=S - P,
                    detail=f"cached entries go on to {S:,}, but no state to resume from "
                           f"lies between {P:,} and {S:,} (a recurrent state can't be cut)")
    rec = _lost_here(tokens, n, chain, P, gone, now)
    if rec is not None:
        earlier = gone.earlier(chain.keys[P // B], rec) if rec.tier == DEVICE else None
        return _departed(P, rec, now, None, "", earlier)
    # the remote keeps a state per snapshot, naming every block below it: one that
    # departed anywhere on the path is what would have restored that far
    rec = _lost_on_path(tokens, n, chain, P, n // B, gone, now, REMOTE)
    if rec is not None:
        return _departed(P, rec, now, rec.position - P, _state(rec))
    miss = _other_root(P, tokens, n, chain, view, salts, fingerprint, now)
    if miss is not None:
        return miss
    return Miss(P, UNSEEN, detail=_UNSEEN)


def _lost_on_path(tokens: list[int], n: int, chain: KeyChain, P: int, top: int, gone: Gone,
                  now: float, tier: str | None = None) -> Departure | None:
    """The deepest departed snapshot on the prompt's path past P, at a block depth up to
    `top` (the depth the cached entries reach: its tail may go past them, as a departed
    tail no longer counts in what they share); tier: only those that left it."""
    B = chain.block_size
    low = max(P // B, top - _PATH_DEPTHS)
    # the parent of depth d is keys[d - 1] (the root for d = 0)
    found = gone.snapshots_after_any(([chain.root] if low == 0 else [])
                                     + chain.keys[max(0, low - 1):top], now)
    if not found:
        return None
    for depth in range(top, low - 1, -1):
        best = None
        for rec in found.get(chain.parent(depth), ()):
            pos = depth * B + len(rec.tail)
            if P < pos <= n and rec.position == pos and list(rec.tail) == tokens[depth * B:pos] \
                    and (tier is None or rec.tier == tier) \
                    and (best is None or pos > best.position):
                best = rec
        if best is not None:
            return best
    return None


def _lost_here(tokens: list[int], n: int, chain: KeyChain, P: int, gone: Gone,
               now: float) -> Departure | None:
    """What departed right where the restore stopped: the prompt's next block, else the
    deepest snapshot inside it that the prompt goes past."""
    B = chain.block_size
    depth, full = P // B, n // B       # the chain may hold more: the answer's
    if depth < full:
        rec = gone.get(chain.keys[depth], now)
        if rec is not None:
            return rec
    if depth > full:
        return None
    best = None
    for rec in gone.snapshots_after(chain.parent(depth), now):
        pos = depth * B + len(rec.tail)
        if P < pos <= n and list(rec.tail) == tokens[depth * B:pos] \
                and (best is None or pos > best.position):
            best = rec
    return best


_LEFT = {EVICTED: "was evicted from {tier}", THINNED: "was thinned (at most --max-snapshots "
         "per prefix)", CORRUPT: "was dropped: it failed verification",
         DELETED: "was deleted (cache admin)", BUDGET: "was never stored: {detail}"}


def _departed(P: int, rec: Departure, now: float, recomputed: int | None, what: str,
              earlier: Departure | None = None) -> Miss:
    when = now - rec.at
    detail = f"{what or f'the {rec.kind} at {rec.position:,} '}{_left(rec)} {ago(when)}"
    if earlier is not None:
        detail += f"; its stored copy {_left(earlier)} {ago(now - earlier.at)}"
    if recomputed:
        detail += f"; restored from {P:,}, {_tokens(recomputed)} recomputed"
    return Miss(P, rec.reason, rec.tier, rec.at, when, recomputed, detail)


def _state(rec: Departure) -> str:
    return f"the {'remote state' if rec.tier == REMOTE else 'snapshot'} at {rec.position:,} "


def _left(rec: Departure) -> str:
    verb = _LEFT.get(rec.reason, "left").format(tier=rec.tier or "the cache",
                                                detail=rec.detail or "a budget refused it")
    return verb + (f" ({rec.detail})" if rec.detail and rec.reason != BUDGET else "")


def _other_root(P: int, tokens: list[int], n: int, chain: KeyChain, view: View,
                salts: Mapping[bytes, str | bytes | None], fingerprint: str,
                now: float) -> Miss | None:
    """The deepest prefix of the prompt cached under another root (another model, salt
    or adapter set), when it goes past P: the first block under every other root in
    one read, then, under the few whose first block matches, the deepest block by a
    galloping search (a key hashed only as far as the search goes); a prompt shorter
    than a block, among the states after each root."""
    B, own = chain.block_size, chain.root
    others = [r for r in view.roots() if r != own]
    if not others:
        return None
    full = min(n // B, len(chain), _PATH_DEPTHS)
    if full:
        firsts = [keys_under(chain, r, 1) for r in others]
        found = view.find_many([keys[0] for keys in firsts])
        best = None
        matched = [(root, keys, hit[0]) for root, keys, hit in zip(others, firsts, found)
                   if _same(hit, tokens, 0, B, now)][:_OTHER_ROOTS]
        for root, keys, meta in matched:
            depth, meta = _deepest(root, keys, meta, chain, tokens, full, view, now)
            if best is None or depth > best[0]:
                best = (depth, root, meta)
        if best is None or best[0] * B <= P:
            return None
        return _classify(P, best[1], best[2], own, salts, fingerprint, best[0] * B)
    head = tokens[:n]
    for root in others:
        for _, meta, _ in view.children_after(root)[:_SHORT_SCAN]:
            if meta.tokens and meta.tokens == head[:len(meta.tokens)] and meta.created <= now:
                return _classify(P, root, meta, own, salts, fingerprint, len(meta.tokens))
    return None


def _same(hit: tuple[EntryMeta, str] | None, tokens: list[int], depth: int, B: int,
          now: float) -> bool:
    """Whether a found block holds the prompt's block `depth` (and was there by now)."""
    return hit is not None and hit[0].tokens == tokens[depth * B:(depth + 1) * B] \
        and hit[0].created <= now


def _deepest(root: bytes, keys: list[bytes], meta: EntryMeta, chain: KeyChain,
             tokens: list[int], full: int, view: View, now: float) -> tuple[int, EntryMeta]:
    """How many of the prompt's leading blocks are cached under `root` (whose first
    block is: `meta`), and the deepest one's entry. The stores are closed (a block is
    there only after its parent), so they are a leading run: found by doubling the
    depth until a block is missing, then halving between, hashing at most twice as
    many blocks as are found."""
    B = chain.block_size

    def at(d: int) -> EntryMeta | None:
        keys_under(chain, root, d, keys)
        hit = view.find_many([keys[d - 1]])[0]
        return hit[0] if _same(hit, tokens, d - 1, B, now) else None
    lo, hi = 1, 2
    while hi <= full and (m := at(hi)) is not None:
        lo, meta, hi = hi, m, 2 * hi
    hi = min(hi, full + 1)                 # the least depth known (or assumed) missing
    while hi - lo > 1:
        mid = (lo + hi) // 2
        m = at(mid)
        if m is not None:
            lo, meta = mid, m
        else:
            hi = mid
    return lo, meta


def _classify(P: int, root: bytes, meta: EntryMeta, own: bytes,
              salts: Mapping[bytes, str | bytes | None], fingerprint: str,
              covered: int) -> Miss:
    """covered: the prompt's tokens cached under that root."""
    what = f"its first {_tokens(covered)} are cached"
    left = covered - P
    if meta.fingerprint != fingerprint:
        return Miss(P, OTHER_MODEL, recomputed=left,
                    detail=f"{what} for another model (weights fingerprint "
                           f"{meta.fingerprint[:12]}, this one {fingerprint[:12]})")
    theirs, ours = salts.get(root, _UNKNOWN), salts.get(own)
    if theirs is _UNKNOWN:
        return Miss(P, OTHER_SALT, recomputed=left,
                    detail=f"{what} under another cache salt or LoRA adapter set (not "
                           "used since this daemon started)")
    if is_adapter_salt(theirs) or is_adapter_salt(ours):
        have = "another LoRA adapter set" if is_adapter_salt(theirs) else "no LoRA adapters"
        want = "its own adapter set" if is_adapter_salt(ours) else "no adapters"
        return Miss(P, OTHER_ADAPTERS, recomputed=left,
                    detail=f"{what} for {have}; this request runs with {want} (prefixes "
                           "never cross adapter sets)")
    return Miss(P, OTHER_SALT, recomputed=left,
                detail=f"{what} under another cache salt (tenants never share entries)")


def _tokens(n: int) -> str:
    return f"{n:,} token{'s' if n != 1 else ''}"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"

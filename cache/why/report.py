"""What a restore reports: where each restored block came from and, for the first token
not restored, why.

    timings.cache = {
      "restored": 6144, "prompt": 6200,
      "tiers": {"device": 4096, "disk": 2048},            restored tokens by tier
      "runs": [{"tier": "device", "start": 0, "end": 4096},
               {"tier": "disk", "start": 4096, "end": 6144}],   in prompt order
      "miss": {"position": 6144, "reason": "thinned", "tier": "", "at": 1764163000.2,
               "ago_s": 95.1, "recomputed": 2048, "detail": "..."}     null: nothing missed
    }

A prompt whose every token but the last was restored has missed nothing: one token
is always computed unless the snapshot kept the last logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ckptd.cache.why.gone import BUDGET, CORRUPT, DELETED, EVICTED, THINNED

UNSEEN = "unseen"              # nothing cached continues the prompt here: never seen (or
#                                gone without a record: before the records, or after a crash)
NO_SNAPSHOT = "no_snapshot"    # cached further, but no state to start from in between
OTHER_SALT = "other_salt"      # cached under another cache salt
OTHER_ADAPTERS = "other_adapters"   # cached for another LoRA adapter set (or none)
OTHER_MODEL = "other_model"    # cached for another model fingerprint
TIER_FAULT = "tier_fault"      # a planned piece could not be read (I/O error, missing, late)
COST = "cost"                  # reading it was estimated slower than computing it
REASONS = (UNSEEN, EVICTED, THINNED, NO_SNAPSHOT, OTHER_SALT, OTHER_ADAPTERS, OTHER_MODEL,
           CORRUPT, TIER_FAULT, BUDGET, COST, DELETED)


@dataclass
class Miss:
    position: int                 # the first prompt token not restored
    reason: str                   # one of REASONS
    tier: str = ""                # the tier an entry left or failed in ("" none / every)
    at: float | None = None       # when it left (unix time)
    ago: float | None = None      # seconds before this request
    recomputed: int | None = None   # tokens computed that a cached (or lost) state covered
    detail: str = ""              # one line for people

    def to_dict(self) -> dict:
        return {"position": self.position, "reason": self.reason, "tier": self.tier or None,
                "at": None if self.at is None else round(self.at, 3),
                "ago_s": None if self.ago is None else round(self.ago, 1),
                "recomputed": self.recomputed, "detail": self.detail}


@dataclass(eq=False, slots=True)
class CacheReport:
    """Made on the engine's thread when a restore ends; its miss is explained when first
    read (a responder, /metrics, the page), off that thread (cache/why/ledger.py)."""
    prompt: int                                        # prompt tokens
    restored: int = 0
    runs: list[tuple[str, int, int]] = field(default_factory=list)   # (tier, start, end)
    restore_ms: float = 0.0
    explained: Miss | None = None
    pending: tuple | None = field(default=None, repr=False)
    #          (ledger, what explaining needs) until it is explained (cache/why/ledger.py)

    @property
    def miss(self) -> Miss | None:
        if self.pending is not None:
            self.pending[0].resolve(self)
        return self.explained

    def tiers(self) -> dict[str, int]:
        return tokens_by_tier(self.runs)

    def to_dict(self) -> dict:
        return {"restored": self.restored, "prompt": self.prompt, "tiers": self.tiers(),
                "runs": [{"tier": t, "start": a, "end": b} for t, a, b in self.runs],
                "miss": None if self.miss is None else self.miss.to_dict()}

    def line(self) -> str:
        """One line for the log: what was restored from where, and why not more."""
        tiers = ", ".join(f"{t} {n:,}" for t, n in self.tiers().items())
        out = f"{self.restored:,} / {self.prompt:,} tokens restored"
        if tiers:
            out += f" ({tiers})"
        out += f" in {self.restore_ms:.1f} ms"
        if self.miss is not None:
            out += f"; miss at {self.miss.position:,}: {self.miss.reason}: {self.miss.detail}"
        return out


def tier_runs(blocks, snapshot, position: int, device_blocks: int,
              block_size: int) -> list[tuple[str, int, int]]:
    """The restored tokens as runs of one tier, in prompt order: the device's leading
    blocks, then the plan's stored blocks (a lookup.Blocks), then the
    snapshot's tail."""
    B, runs = block_size, []

    def add(tier: str, a: int, b: int) -> None:
        if b <= a:
            return
        if runs and runs[-1][0] == tier and runs[-1][2] == a:
            runs[-1] = (tier, runs[-1][1], b)
        else:
            runs.append((tier, a, b))
    add("device", 0, min(device_blocks * B, position))
    end = device_blocks * B
    for tier, n in blocks.tier_counts():
        add(tier, end, end + n * B)
        end += n * B
    if snapshot is not None:
        add(snapshot.tier, end, position)
    return runs


def tokens_by_tier(runs: list[tuple[str, int, int]]) -> dict[str, int]:
    """Restored tokens by the tier that held them."""
    out: dict[str, int] = {}
    for tier, a, b in runs:
        out[tier] = out.get(tier, 0) + b - a
    return out


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "at an unknown time"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s} s ago"
    if s < 3600:
        return f"{s // 60}m {s % 60}s ago"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m ago"
    return f"{s // 86400}d {s % 86400 // 3600}h ago"

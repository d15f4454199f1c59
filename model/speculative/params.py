"""Speculative decoding's settings: how many tokens a draft proposes, and llama.cpp's
synthetic acceptance for benchmarking (common/speculative.cpp's semantics)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DraftLimits:
    """How a draft proposes (llama-server's --spec-draft-n-max / -n-min / -p-min and a
    request's speculative.n_max / n_min / p_min). In a request, None keeps the server's."""
    n_max: int | None = None       # tokens drafted at most per step (0: no drafting)
    n_min: int | None = None       # a shorter draft is dropped
    p_min: float | None = None     # drafting stops at a token the draft gives less

    def __post_init__(self) -> None:
        for name in ("n_max", "n_min"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"speculative.{name} must be an integer >= 0, got {v!r}")
        p = self.p_min
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float))
                              or not 0.0 <= p <= 1.0):
            raise ValueError(f"speculative.p_min must be a number in [0, 1], got {p!r}")

    def over(self, base: DraftLimits) -> DraftLimits:
        """These limits where given, base's elsewhere."""
        return DraftLimits(base.n_max if self.n_max is None else self.n_max,
                           base.n_min if self.n_min is None else self.n_min,
                           base.p_min if self.p_min is None else self.p_min)


# llama.cpp's defaults (common/common.h: common_params_speculative_draft)
DEFAULT_LIMITS = DraftLimits(3, 0, 0.0)
TYPES = ("none", "draft-simple")    # of llama.cpp's --spec-type values, those ckptd has


def parse_types(text: str) -> bool:
    """--spec-type's comma-separated list: whether it asks for a draft model."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in TYPES]
    if bad:
        raise ValueError(f"--spec-type: {bad[0]!r} is not supported (ckptd has: "
                         f"{', '.join(TYPES)})")
    return "draft-simple" in names


def parse_rates(text: str) -> tuple[float, ...]:
    """--spec-synth-rates P0,P1,...: numbers, each checked by synth_rates()."""
    out = []
    for raw in text.split(","):
        try:
            out.append(float(raw.strip()))
        except ValueError:
            raise ValueError(f"--spec-synth-rates: not a number: {raw.strip()!r}") from None
    return tuple(out)


def synth_rates(length: float | None, rates: tuple[float, ...] | None,
                n_max: int) -> tuple[float, ...]:
    """The unconditional per-position acceptance rates of synthetic acceptance, from
    --spec-synth-len (a mean accepted length, the target's token included) or
    --spec-synth-rates, as llama.cpp resolves them; () when neither is given."""
    if length is None and not rates:
        return ()
    if length is not None and rates:
        raise ValueError("--spec-synth-len and --spec-synth-rates are mutually exclusive")
    if n_max <= 0:
        raise ValueError("synthetic acceptance needs --spec-draft-n-max >= 1")
    if rates:
        if len(rates) != n_max:
            raise ValueError(f"--spec-synth-rates must hold {n_max} values "
                             f"(--spec-draft-n-max), got {len(rates)}")
        for i, r in enumerate(rates):
            if not math.isfinite(r) or not 0.0 <= r <= 1.0:
                raise ValueError("--spec-synth-rates must be finite and within [0, 1]")
            if i and r > rates[i - 1]:
                raise ValueError("--spec-synth-rates must not increase")
        return tuple(rates)
    top = n_max + 1.0
    if not math.isfinite(length) or not 1.0 <= length <= top:
        raise ValueError(f"--spec-synth-len must be within [1, {top:.0f}], got {length}")
    p = 1.0 if length == top else 0.0
    if 1.0 < length < top:            # p + p^2 + ... + p^n_max = length - 1, bisected
        lo, hi = 0.0, 1.0
        for _ in range(32):
            mid = 0.5 * (lo + hi)
            if sum(mid ** (j + 1) for j in range(n_max)) < length - 1.0:
                lo = mid
            else:
                hi = mid
        p = 0.5 * (lo + hi)
    return tuple(p ** (j + 1) for j in range(n_max))


def conditional(rates: tuple[float, ...]) -> tuple[float, ...]:
    """P(accept position i | positions before it accepted), as llama.cpp draws them."""
    out, prev = [], 1.0
    for r in rates:
        out.append(r / prev if prev > 0.0 else 0.0)
        prev = r
    return tuple(out)

"""The cache's fields in responses, in one place for every responder:

- `timings.cache` (llama.cpp routes, and wherever `timings` goes): the restore's
  report (cache/why/report.py): tokens restored by tier, the runs of blocks in
  prompt order, and why the first token not restored was not;
- `usage.prompt_tokens_details` (OpenAI routes; `input_tokens_details` on the
  Responses API): besides OpenAI's `cached_tokens`, `cached_tokens_by_tier` and
  `cache_miss` (the miss object, or null when the whole prompt was restored).

A request that does not use the cache (cache_prompt false, or a daemon without a
store) reports the reason "disabled".
"""

from __future__ import annotations

DISABLED = "disabled"


def timings_cache(stats) -> dict:
    """stats: daemon/request.py's Stats, after admission."""
    if stats.cache is not None:
        return stats.cache.to_dict()
    miss = None if stats.prompt_n <= 1 else {
        "position": 0, "reason": DISABLED, "tier": None, "at": None, "ago_s": None,
        "recomputed": None, "detail": "this request does not use the cache"}
    return {"restored": 0, "prompt": stats.prompt_n, "tiers": {}, "runs": [], "miss": miss}


def prompt_details(stats_list) -> dict:
    """The extension of prompt_tokens_details for the distinct prompts of one request:
    tokens restored by tier (summed) and the first prompt's miss that has one."""
    by_tier: dict[str, int] = {}
    miss = None
    for st in stats_list:
        field = timings_cache(st)
        for tier, n in field["tiers"].items():
            by_tier[tier] = by_tier.get(tier, 0) + n
        if miss is None:
            miss = field["miss"]
    return {"cached_tokens_by_tier": by_tier, "cache_miss": miss}

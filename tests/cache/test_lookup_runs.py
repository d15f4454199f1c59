"""Planning a run of blocks at once (cache/lookup.py: _block_run) finds the same blocks
block by block would: a stored block that is not the prompt's (a key collision's other
tokens, another position, a damaged token list) ends the plan exactly there."""

from __future__ import annotations

import pytest

from ckptd.cache.entry import BLOCK, SNAPSHOT, EntryMeta
from ckptd.cache.keys import prompt_chain
from ckptd.cache.lookup import DISK, HOST, _block_run, plan_restore

B, FP = 16, "fp"


class View:
    """An IndexView over a dict: key -> (meta, tier)."""

    def __init__(self, entries: dict) -> None:
        self.entries = entries

    def find_many(self, keys):
        return [self.entries.get(k) for k in keys]

    def children_after(self, parent):
        return [(k, m, t) for k, (m, t) in self.entries.items() if m.parent == parent]

    def has_snapshots(self, parent):
        return any(m.kind == SNAPSHOT for _, m, _ in self.children_after(parent))


def _stored(tokens: list[int], n: int) -> tuple:
    chain = prompt_chain(FP, B, tokens)
    entries = {}
    for i in range(n):
        meta = EntryMeta(BLOCK, chain.parent(i), (i + 1) * B, tokens[i * B:(i + 1) * B], FP,
                         stored_bytes=100 + i, logical_bytes=4096)
        entries[chain.keys[i]] = (meta, HOST if i % 3 else DISK)
    return chain, entries


def _plan(tokens, chain, entries, dev=0):
    return plan_restore(tokens, len(tokens), chain, False, View(entries), dev)


def test_a_whole_run_is_planned_with_each_blocks_tier_and_size():
    tokens = list(range(3, 3 + 40 * B))
    chain, entries = _stored(tokens, 40)
    for dev in (0, 7):
        plan = _plan(tokens, chain, entries, dev)
        assert plan.position == 40 * B
        assert [p.key for p in plan.blocks] == chain.keys[dev:40]
        assert [p.tier for p in plan.blocks] == [entries[k][1] for k in chain.keys[dev:40]]
        assert [p.nbytes for p in plan.blocks] == [
            4096 if t == HOST else 100 + i for i, (_, t) in
            enumerate(entries[k] for k in chain.keys[:40]) if i >= dev]
        assert [p.position for p in plan.blocks] == [(i + 1) * B for i in range(dev, 40)]


@pytest.mark.parametrize("damage", ["tokens", "position", "kind", "short", "long", "gap"])
def test_a_block_that_is_not_the_prompts_ends_the_run_there(damage):
    tokens = list(range(3, 3 + 40 * B))
    chain, entries = _stored(tokens, 40)
    bad = 23
    key = chain.keys[bad]
    meta, tier = entries[key]
    if damage == "tokens":              # what a key collision would look like
        meta.tokens = [t + 1 for t in meta.tokens]
    elif damage == "position":
        meta.position += B
    elif damage == "kind":
        meta.kind = SNAPSHOT
    elif damage == "short":             # the run's tokens still line up: 15 here, 17 next
        meta.tokens = meta.tokens[:-1]
        nxt = entries[chain.keys[bad + 1]][0]
        nxt.tokens = [tokens[(bad + 1) * B - 1], *nxt.tokens]
    elif damage == "long":
        meta.tokens = [*meta.tokens, tokens[(bad + 1) * B]]
    else:
        del entries[key]
    for dev in (0, 5):
        keys = chain.keys[dev:40]
        run = _block_run(tokens, B, dev, keys, View(entries).find_many(keys))
        assert [p.key for p in run] == chain.keys[dev:bad]
        assert [p.position for p in run] == [(i + 1) * B for i in range(dev, bad)]

"""The device tier's page pool and prefix table, alone: refcounts, closed chains,
leaf-first reclaim, lookups by binary search with the tokens checked."""

from __future__ import annotations

from collections import Counter

import pytest

from ckptd.cache.device import DevicePages, OutOfPages
from ckptd.cache.keys import KeyChain

B = 4
ROOT = b"r" * 16


def chain(tokens) -> KeyChain:
    return KeyChain(ROOT, B, tokens)


def publish(dev: DevicePages, ch: KeyChain, pages: list[int]) -> list[int]:
    """Register pages as the chain's first blocks, as the cache manager does."""
    out = []
    for i, p in enumerate(pages):
        out.append(dev.register(ch.keys[i], ch.keys[i - 1] if i else None, p,
                                ch.data[i * 4 * B:(i + 1) * 4 * B]))
    return out


def test_a_published_chain_is_found_up_to_where_the_prompts_part():
    dev = DevicePages(8, B)
    toks = list(range(100, 116))                       # four blocks
    ch = chain(toks)
    pages = dev.alloc(4)
    assert publish(dev, ch, pages) == pages
    assert dev.find(chain(toks + [1, 2])) == pages
    assert dev.find(chain(toks[:9] + [7] * 7)) == pages[:2]   # parts inside block 2
    assert dev.find(chain([9] + toks[1:])) == []
    assert dev.find(ch, max_blocks=3) == pages[:3]
    other = KeyChain(b"s" * 16, B, toks)                # another salt: another root
    assert dev.find(other) == []


def test_a_key_naming_other_tokens_is_not_served():
    dev = DevicePages(4, B)
    ch = chain(list(range(8)))
    pages = dev.alloc(2)
    publish(dev, ch, pages)
    dev._tokens[pages[1]] = bytes(16)                    # what a key collision would look like
    assert dev.find(ch) == pages[:1]


def test_the_table_stays_closed():
    dev = DevicePages(4, B)
    ch = chain(list(range(12)))
    a = dev.alloc(3)
    # block 1 can't be registered before block 0: the chain would have a hole
    assert dev.register(ch.keys[1], ch.keys[0], a[1], ch.data[16:32]) == a[1]
    assert dev.num_registered == 0
    publish(dev, ch, a)
    assert dev.num_registered == 3
    dev.decref(a)
    dev.sanity_check(Counter())


def test_reclaim_takes_least_recent_leaves_first():
    dev = DevicePages(6, B)
    x, y = chain(list(range(12))), chain(list(range(50, 62)))
    px, py = dev.alloc(3), dev.alloc(3)
    publish(dev, x, px)
    publish(dev, y, py)
    dev.decref(px + py)                                  # all six cached
    assert dev.num_free == 0 and dev.num_cached == 6
    assert dev.find(x) == px                             # x is now the most recent
    got = dev.alloc(2)                                   # y's two deepest blocks go
    assert sorted(got) == sorted(py[1:])
    assert dev.find(y) == py[:1] and dev.find(x) == px   # y's first block is still there
    dev.decref(got)
    dev.incref([px[0]])                                  # a sequence holds x's first block
    with pytest.raises(OutOfPages):
        dev.alloc(7)
    assert dev.find(x) == px                             # nothing was taken
    dev.decref([px[0]])
    dev.sanity_check(Counter())


def test_lowest_free_ids_first():
    dev = DevicePages(12, B)
    a, b = dev.alloc(5), dev.alloc(4)
    assert a == [0, 1, 2, 3, 4] and b == [5, 6, 7, 8]
    dev.decref(list(reversed(a)))                        # freed in any order
    dev.decref([6, 8])
    assert dev.alloc(7) == [0, 1, 2, 3, 4, 6, 8]         # consecutive runs, ascending
    with pytest.raises(ValueError):
        DevicePages(-1, B)


def test_evict_cached_frees_every_unheld_page():
    dev = DevicePages(5, B)
    ch = chain(list(range(16)))
    pages = dev.alloc(4)
    publish(dev, ch, pages)
    dev.decref(pages[2:])                                # a sequence still holds 0 and 1
    assert dev.evict_cached() == 2
    assert dev.find(ch) == pages[:2]
    dev.sanity_check(Counter({pages[0]: 1, pages[1]: 1}))


def test_sanity_check_finds_a_leaked_page():
    dev = DevicePages(4, B)
    pages = dev.alloc(2)
    dev.decref(pages[:1])
    dev.sanity_check(Counter({pages[1]: 1}))
    with pytest.raises(AssertionError, match="leaked"):
        dev.sanity_check(Counter())                      # nobody holds page 1

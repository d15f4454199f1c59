"""Which entries to evict: least-recently-used leaves first, never pinned ones.

A leaf is an entry nothing else names as its parent, so evicting it keeps every
prefix closed: no block stays whose parent is gone. Evicting a leaf can make its
parent a leaf; the loop continues until enough bytes are freed.
"""

from __future__ import annotations

from cache.entry import EntryMeta


def pick_victims(entries: list[tuple[bytes, EntryMeta]], need_bytes: int) -> list[bytes]:
    if need_bytes <= 0:
        return []
    metas = dict(entries)
    children: dict[str, int] = {}
    for m in metas.values():
        children[m.parent] = children.get(m.parent, 0) + 1
    victims: list[bytes] = []
    freed = 0
    while freed < need_bytes:
        leaves = [(m.last_used, k) for k, m in metas.items()
                  if not m.pinned and children.get(k.hex(), 0) == 0]
        if not leaves:
            break
        leaves.sort()
        for _, k in leaves:
            m = metas.pop(k)
            victims.append(k)
            freed += m.stored_bytes
            children[m.parent] -= 1
            if freed >= need_bytes:
                break
    return victims

"""The prefix tree of a cache, from its entries' parent links: `ckptd inspect tree` and
the daemon's page (GET /cache/tree) draw it.

Entries form a forest: a block names the block before it, a snapshot names the last
full block below its position, and block 0 (or a snapshot inside it) names a root
key (model fingerprint, block size, salt). Shown one entry per line, a 250K-token
prompt would be 15K lines, so a run of blocks that continues without branching is
one node ("blocks 3..40"); snapshots hanging anywhere on the run are its children,
and the run ends where the prompts that share it part ways. An entry dict may say
which tiers hold it (`tiers`); a run counts its blocks per tier.

Nodes come out as a flat list with parent and children ids, so that the JSON form of
a deep tree never nests (json can't encode ~1000 levels) and the text form is drawn
without recursion.
"""

from __future__ import annotations

import heapq

BLOCK, SNAPSHOT, ROOT = "block", "snapshot", "root"


def build(entries: list[dict]) -> dict:
    """{"roots": [ids], "nodes": {id: node}} for entries as EntryInfo dicts. A node is a
    root (a key no entry has, named as parent), a run of blocks (kind "blocks", its id is
    its last block's key, the one that further nodes hang from) or a snapshot."""
    by_key = {e["key"]: e for e in entries}
    kids: dict[str, list[dict]] = {}
    for e in entries:
        kids.setdefault(e["parent"], []).append(e)
    for v in kids.values():
        v.sort(key=lambda e: (e["position"], e["tokens"]))
    nodes: dict[str, dict] = {}
    roots = sorted(p for p in kids if p not in by_key)
    todo: list[tuple[dict, str]] = []
    for r in roots:
        first = kids[r][0]
        nodes[r] = {"id": r, "kind": ROOT, "parent": None, "fingerprint": first["fingerprint"],
                    # a block parent that is gone: should never happen (prefixes stay closed)
                    "missing_parent": any(e["position"] != len(e["tokens"]) for e in kids[r]),
                    "children": []}
        todo += [(e, r) for e in reversed(kids[r])]
    while todo:
        e, parent = todo.pop()
        if e["kind"] == SNAPSHOT:
            node = _snapshot(e, parent)
        else:
            node, branches = _run(e, parent, kids)
            todo += [(b, node["id"]) for b in reversed(branches)]
            for s in node.pop("snapshots"):
                nodes[s["key"]] = _snapshot(s, node["id"])
                node["children"].append(s["key"])
        nodes[node["id"]] = node
        nodes[parent]["children"].append(node["id"])
    _totals(nodes, roots)
    return {"roots": roots, "nodes": nodes}


def _snapshot(e: dict, parent: str) -> dict:
    return {"id": e["key"], "kind": SNAPSHOT, "parent": parent, "position": e["position"],
            "tail_tokens": len(e["tokens"]), "tokens": e["tokens"],
            "stored_bytes": e["stored_bytes"], "logical_bytes": e["logical_bytes"],
            "pinned": e["pinned"], "hits": e["hits"], "last_used": e["last_used"],
            "tiers": _tiers([e]), "children": []}


def _run(first: dict, parent: str, kids: dict[str, list[dict]]) -> tuple[dict, list[dict]]:
    """Follow single block children from `first`; returns the run's node (with the
    snapshots met on the way) and the blocks it branches into at its end."""
    run, snaps = [first], []
    while True:
        below = kids.get(run[-1]["key"], [])
        snaps += [e for e in below if e["kind"] == SNAPSHOT]
        blocks = [e for e in below if e["kind"] == BLOCK]
        if len(blocks) != 1:
            break
        run.append(blocks[0])
    B = len(first["tokens"]) or 1
    node = {"id": run[-1]["key"], "kind": "blocks", "parent": parent,
            "first_key": first["key"], "first_block": first["position"] // B - 1,
            "last_block": run[-1]["position"] // B - 1, "count": len(run),
            "start": first["position"] - B, "end": run[-1]["position"],
            "tokens": first["tokens"],
            "stored_bytes": sum(e["stored_bytes"] for e in run),
            "logical_bytes": sum(e["logical_bytes"] for e in run),
            "pinned": sum(e["pinned"] for e in run), "hits": max(e["hits"] for e in run),
            "last_used": max(e["last_used"] for e in run), "branches": len(blocks),
            "tiers": _tiers(run), "children": [],
            "snapshots": sorted(snaps, key=lambda e: e["position"])}
    return node, blocks


def _totals(nodes: dict[str, dict], roots: list[str]) -> None:
    """Entries and stored bytes of every node's subtree, children before parents."""
    order, todo = [], list(roots)
    while todo:
        n = nodes[todo.pop()]
        order.append(n)
        todo += n["children"]
    for n in reversed(order):
        own = n.get("count", 1 if n["kind"] == SNAPSHOT else 0)
        n["subtree_entries"] = own + sum(nodes[c]["subtree_entries"] for c in n["children"])
        n["subtree_bytes"] = n.get("stored_bytes", 0) + sum(
            nodes[c]["subtree_bytes"] for c in n["children"])




def _tiers(entries: list[dict]) -> dict[str, int]:
    """How many of the entries each tier holds (entries that say)."""
    out: dict[str, int] = {}
    for e in entries:
        for t in e.get("tiers", ()):
            out[t] = out.get(t, 0) + 1
    return out


def largest(tree: dict, limit: int = 60) -> list[dict]:
    """The biggest branches, for a page: at most `limit` nodes, taken largest subtree
    first from the roots down (a node only after its parent), in drawing order (depth
    first, bigger branches first), each with its depth and what was left out below it
    (`hidden`: branches and bytes). A run's snapshots are folded into it (positions)."""
    nodes = tree["nodes"]

    def shown(nid: str) -> list[str]:
        n = nodes[nid]
        kids = [c for c in n["children"]
                if n["kind"] == ROOT or nodes[c]["kind"] != SNAPSHOT]
        return sorted(kids, key=lambda c: -nodes[c]["subtree_bytes"])
    heap = [(-nodes[r]["subtree_bytes"], r) for r in tree["roots"]]
    heapq.heapify(heap)
    chosen: set[str] = set()
    while heap and len(chosen) < limit:
        _, nid = heapq.heappop(heap)
        chosen.add(nid)
        for c in shown(nid):
            heapq.heappush(heap, (-nodes[c]["subtree_bytes"], c))
    out: list[dict] = []
    todo = [(r, 0) for r in sorted(chosen & set(tree["roots"]),
                                   key=lambda r: nodes[r]["subtree_bytes"])]
    while todo:
        nid, depth = todo.pop()
        n = nodes[nid]
        kids = shown(nid)
        left = [c for c in kids if c not in chosen]
        row = {k: v for k, v in n.items() if k not in ("children", "snapshots")}
        row.update(depth=depth, hidden={"branches": len(left), "bytes": sum(
            nodes[c]["subtree_bytes"] for c in left)})
        if n["kind"] == "blocks":
            row["snapshots"] = sorted(nodes[c]["position"] for c in n["children"]
                                      if nodes[c]["kind"] == SNAPSHOT)
        out.append(row)
        todo += [(c, depth + 1) for c in reversed(kids) if c in chosen]
    return out

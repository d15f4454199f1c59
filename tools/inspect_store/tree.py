"""The prefix tree of a cache, from its entries' parent links, for `ckptd inspect tree`.

Entries form a forest: a block names the block before it, a snapshot names the last
full block below its position, and block 0 (or a snapshot inside it) names a root
key (model fingerprint, block size, salt). Shown one entry per line, a 250K-token
prompt would be 15K lines, so a run of blocks that continues without branching is
one node ("blocks 3..40"); snapshots hanging anywhere on the run are its children,
and the run ends where the prompts that share it part ways.

Nodes come out as a flat list with parent and children ids, so that the JSON form of
a deep tree never nests (json can't encode ~1000 levels) and the text form is drawn
without recursion.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.markup import escape
from rich.tree import Tree

from ckptd.tools.inspect_store.render import human_bytes, preview

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
            "children": []}


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
            "children": [],
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


def label(n: dict, decode: Callable[[list[int]], str | None] | None = None) -> str:
    """One line of plain text for a node (the DOT labels and the terminal tree)."""
    if n["kind"] == ROOT:
        what = "missing parent" if n["missing_parent"] else "root"
        return (f"{what} {n['id'][:12]}  fp {n['fingerprint']}  "
                f"({n['subtree_entries']} entries, {human_bytes(n['subtree_bytes'])})")
    pin = "  pinned" if n["pinned"] else ""
    hits = f"  {n['hits']} hits" if n["hits"] else ""
    if n["kind"] == SNAPSHOT:
        text = f"  {preview(n['tokens'], decode)}" if n["tail_tokens"] else ""
        return (f"snapshot @{n['position']} (+{n['tail_tokens']} tokens, "
                f"{human_bytes(n['stored_bytes'])})  {n['id'][:12]}{pin}{hits}{text}")
    a, b = n["first_block"], n["last_block"]
    blocks = f"block {a}" if a == b else f"blocks {a}..{b}"
    pin = f"  {n['pinned']}/{n['count']} pinned" if n["pinned"] else ""
    under = ""
    if n["branches"] > 1:
        under = f"  [subtree {n['subtree_entries']} entries, " \
                f"{human_bytes(n['subtree_bytes'])}]"
    return (f"{blocks} ({n['count']} block{'s' * (n['count'] > 1)}, "
            f"{human_bytes(n['stored_bytes'])}) tokens {n['start']}..{n['end']}  "
            f"{n['id'][:12]}{pin}{hits}{under}  {preview(n['tokens'], decode)}")


def to_rich(tree: dict, decode=None) -> list[Tree]:
    """One rich Tree per root, built without recursion."""
    nodes, out = tree["nodes"], []
    for r in tree["roots"]:
        top = Tree(escape(label(nodes[r], decode)), guide_style="dim")
        todo = [(top, c) for c in reversed(nodes[r]["children"])]
        while todo:
            at, cid = todo.pop()
            n = nodes[cid]
            style = "cyan" if n["kind"] == SNAPSHOT else "bold"
            branch = at.add(escape(label(n, decode)), style=style)
            todo += [(branch, c) for c in reversed(n["children"])]
        out.append(top)
    return out


def to_json(tree: dict) -> dict:
    return {"roots": tree["roots"], "nodes": list(tree["nodes"].values())}


def to_dot(tree: dict, decode=None) -> str:
    lines = ["digraph ckptd_cache {", "  rankdir=LR;",
             '  node [fontname="monospace", fontsize=10];']
    for n in tree["nodes"].values():
        shape = {ROOT: "plaintext", SNAPSHOT: "ellipse"}.get(n["kind"], "box")
        style = ', style="bold"' if n["kind"] != ROOT and n["pinned"] else ""
        text = label(n, decode).replace("  ", "\n", 2)
        lines.append(f'  "{n["id"]}" [shape={shape}{style}, label="{_dot_escape(text)}"];')
    for n in tree["nodes"].values():
        for c in n["children"]:
            lines.append(f'  "{n["id"]}" -> "{c}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

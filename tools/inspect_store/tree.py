"""`ckptd inspect tree` draws the prefix tree built by cache/tree.py: as text (rich), as
JSON, or as Graphviz DOT. Nodes are drawn without recursion (a tree can be ~1000
levels deep).
"""

from __future__ import annotations

from collections.abc import Callable

from rich.markup import escape
from rich.tree import Tree

from ckptd.cache.tree import ROOT, SNAPSHOT
from ckptd.tools.inspect_store.render import human_bytes, preview


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

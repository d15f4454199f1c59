"""ckptd's imports read from its files: no circle of imports anywhere in the package, and
an import inside a function only where a comment says why (an optional dependency, a
command that must answer without loading torch).

Every import counts: at the top of a module, under `if TYPE_CHECKING:`, and inside
functions, where a circle would otherwise hide. `from ckptd.a import b` is an edge to
the module ckptd.a.b when there is one, else to ckptd.a.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("cache", "daemon", "kernels", "model", "tools")      # ckptd.<folder>


def modules(root: Path) -> dict[str, Path]:
    """ckptd.<dotted name> -> file, for every module of the package under `root`."""
    out = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(["ckptd", *parts])] = path
    return out


def _target(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(ckptd module imported, line) for every import statement of one file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package
                for _ in range(node.level - 1):
                    up = up.rpartition(".")[0]
                base = f"{up}.{base}" if base else up
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                     for a in node.names]
        else:
            continue
        for name in names:
            target = _target(name, known) if name.startswith("ckptd.") else None
            if target is not None and target != module:
                out.append((target, node.lineno))
    return out


def cycles(root: Path) -> list[list[str]]:
    """The import circles of the package under `root`: each a list of 'a.py:line ->
    ckptd.b' edges around one strongly connected set of modules (Tarjan)."""
    known = modules(root)
    edges = {m: imports(m, p, known) for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:          # iterative: deep chains must not recurse
        work = [(v, iter(edges[v]))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            for w, _ in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(edges[w])))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        group.add(w)
                        if w == node:
                            break
                    if len(group) > 1:
                        found.append(group)

    for v in edges:
        if v not in index:
            visit(v)
    return [list(dict.fromkeys(f"{known[a].relative_to(root)}:{line} -> {b}"
                               for a in sorted(group) for b, line in edges[a] if b in group))
            for group in found]


def unexplained_local_imports(root: Path) -> list[str]:
    """'file:line' of every import inside a function or class that no comment explains:
    none on the line above a run of imports or on one of its lines, and not in a `try:`
    that catches ImportError (an optional dependency, said by the handler)."""
    out = []
    for path in modules(root).values():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        optional: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Try) and any(
                    h.type is not None and "ImportError" in ast.unparse(h.type)
                    for h in node.handlers):
                optional.update(id(n) for n in ast.walk(node))
        for scope in ast.walk(tree):
            if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for node in ast.walk(scope):
                for body in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")):
                    for run in _import_runs(body if isinstance(body, list) else []):
                        said = lines[run[0].lineno - 2:run[-1].end_lineno]
                        if not any("#" in line for line in said):
                            out += [f"{path.relative_to(root)}:{n.lineno}" for n in run
                                    if id(n) not in optional]
    return sorted(set(out))


def _import_runs(body: list[ast.stmt]) -> list[list[ast.stmt]]:
    """The runs of consecutive import statements in a block."""
    runs: list[list[ast.stmt]] = []
    for prev, node in zip([None, *body], body):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(prev, (ast.Import, ast.ImportFrom)):
                runs[-1].append(node)
            else:
                runs.append([node])
    return runs


def test_no_import_circle():
    found = cycles(ROOT)
    assert found == [], "import circles:\n" + "\n\n".join("\n".join(c) for c in found)


def test_imports_inside_functions_say_why():
    assert unexplained_local_imports(ROOT) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    """The checker itself: a circle closed by an import inside a function, and one
    through `from package import module`, are both reported; a chain is not."""
    _write(tmp_path, {
        "model/__init__.py": "",
        "model/a.py": "from ckptd.model.b import f\n",
        "model/b.py": "def f():\n    from ckptd.model import a\n    return a\n",
        "model/c.py": "from ckptd.model import b\n",
        "cache/__init__.py": "",
        "cache/x.py": "import ckptd.cache.y\n",
        "cache/y.py": "from ckptd.cache.z import g\n",
        "cache/z.py": "from .x import h\n",
    })
    found = sorted(sorted(c) for c in cycles(tmp_path))
    assert found == [["cache/x.py:1 -> ckptd.cache.y", "cache/y.py:1 -> ckptd.cache.z",
                      "cache/z.py:1 -> ckptd.cache.x"],
                     ["model/a.py:1 -> ckptd.model.b", "model/b.py:2 -> ckptd.model.a"]]
    assert unexplained_local_imports(tmp_path) == ["model/b.py:2"]

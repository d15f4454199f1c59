"""The project installs as one package, `ckptd`, and its scripts run from a checkout."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")     # Python 3.11+
ROOT = Path(__file__).resolve().parents[1]
PARTS = ("cache", "daemon", "kernels", "model", "tools")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed_under_ckptd():
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = {"ckptd." + ".".join(p.parent.relative_to(ROOT).parts)
             for part in PARTS for p in (ROOT / part).rglob("__init__.py")}
    assert found == listed


def test_no_file_in_tools_is_named_like_a_standard_module():
    # a script runs with its own folder first on sys.path: tools/inspect.py once
    # shadowed the standard library's inspect for every script beside it
    clashes = [str(p.relative_to(ROOT)) for p in (ROOT / "tools").rglob("*")
               if p.stem in sys.stdlib_module_names]
    assert clashes == []


def test_code_imports_the_parts_through_ckptd():
    bare = re.compile(r"^\s*(from|import) (cache|daemon|kernels|model|tools)\b", re.M)
    offenders = [str(p.relative_to(ROOT)) for part in (*PARTS, "tests")
                 for p in (ROOT / part).rglob("*.py") if bare.search(p.read_text())]
    assert offenders == []


def test_the_wheel_holds_only_ckptd(tmp_path):
    # built from a copy: setuptools leaves a build/ folder beside the sources
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for part in PARTS:
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                          "-q", "-w", str(tmp_path), str(src)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    wheel = next(tmp_path.glob("ckptd-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        tops = {name.split("/")[0] for name in z.namelist()}
        names = set(z.namelist())
    assert {t for t in tops if not t.endswith(".dist-info")} == {"ckptd"}
    for part in PARTS:
        assert f"ckptd/{part}/__init__.py" in names
    assert "ckptd/cache/store/store.py" in names and "ckptd/tools/bench/kernels.py" in names
    # the cache page the daemon serves at / (package data)
    assert {"ckptd/daemon/http/page/index.html", "ckptd/daemon/http/page/page.js"} <= names


def test_ckptd_imports_from_any_folder(tmp_path):
    code = "import ckptd.cache.keys, ckptd.daemon.config; print(ckptd.cache.keys.KEY_BYTES)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "16", out.stderr


@pytest.mark.parametrize("script", ["tools/bench/kernels.py"])
def test_a_benchmark_script_runs_from_a_checkout(script):
    out = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "usage" in out.stdout, out.stderr

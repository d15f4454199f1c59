"""Run llama.cpp's own HTTP-server test suite against ckptd.

    python -m ckptd.tools.llama_suite [--model M] [-k EXPR] [pytest args...]

Fetches the suite from the llama-cpp-python sdist on PyPI (the one
tools/fetch_llamacpp.py downloads: vendor/llama.cpp/tools/server/tests) into
third_party/llama-server-tests/, turns off its model downloads, and runs it with
LLAMA_SERVER_BIN_PATH naming a wrapper around tools/llama_adapter.py. Tests listed
in tools/llama_suite_exclude.txt are deselected; each line there gives its reason.
"""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

from ckptd.tools.fetch_llamacpp import _download

ROOT = Path(__file__).resolve().parents[1]
EXCLUDE = Path(__file__).with_name("llama_suite_exclude.txt")
_PREFIX = "vendor/llama.cpp/tools/server/tests/"
# utils.py imports `wget` for downloads; the suite runs offline against ckptd's model
_NO_WGET = '"""Downloads are off: the suite runs against ckptd\'s own model."""\n\n\n' \
           'def download(url, out=None):\n' \
           '    raise RuntimeError(f"downloads are off in this run: {url}")\n'


def fetch(dest: Path) -> Path:
    """The suite's folder (extracted once), with downloads turned off."""
    out = dest / "llama-server-tests"
    if (out / "utils.py").is_file():
        return out
    sdist = _download(dest / "cache")
    tmp = out.with_name(out.name + ".partial")
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            rel = m.name.split("/", 1)[1] if "/" in m.name else ""
            if m.isfile() and rel.startswith(_PREFIX):
                m.name = rel[len(_PREFIX):]
                members.append(m)
        tar.extractall(tmp, members=members, filter="data")
    conftest = tmp / "conftest.py"
    text = conftest.read_text()
    conftest.write_text(text.replace("        ServerPreset.load_all()",
                                     "        pass  # ckptd: no model downloads"))
    (tmp / "wget.py").write_text(_NO_WGET)
    tmp.rename(out)
    return out


def exclusions(path: Path = EXCLUDE) -> dict[str, str]:
    """test id -> reason, from the checked-in list ("unit/x.py::test_y  # reason")."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        test, _, reason = line.partition("#")
        if not reason.strip():
            raise ValueError(f"{path}: {test.strip()} has no reason")
        out[test.strip()] = reason.strip()
    return out


def wrapper(folder: Path) -> Path:
    """An executable that starts ckptd through the adapter, for LLAMA_SERVER_BIN_PATH."""
    path = folder / "ckptd-as-llama-server"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} -m ckptd.tools.llama_adapter \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def command(suite: Path, extra: list[str]) -> list[str]:
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE"]
    for test in exclusions():
        args += ["--deselect", test]
    return args + (extra or ["unit"])


def run(extra: list[str], model: str | None, dest: Path) -> int:
    suite = fetch(dest)
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(wrapper(suite)),
           "PYTHONPATH": os.pathsep.join([str(suite), os.environ.get("PYTHONPATH", "")])}
    if model:
        env["CKPTD_SUITE_MODEL"] = str(Path(model).resolve())
    return subprocess.call(command(suite, extra), cwd=suite, env=env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model for ckptd (default: SmolLM2)")
    p.add_argument("--dest", type=Path, default=ROOT / "third_party")
    args, extra = p.parse_known_args(argv)
    try:
        return run(extra, args.model, args.dest)
    except (RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

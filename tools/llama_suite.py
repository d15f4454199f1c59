"""Run llama.cpp's own HTTP-server test suite against ckptd.

    python -m ckptd.tools.llama_suite [--model M] [pytest args...]

Fetches the suite from the llama-cpp-python sdist on PyPI (the one
tools/fetch_llamacpp.py downloads) into third_party/llama-server-suite/, keeping the
sdist's layout around it (tools/server/tests beside models/templates, the chat
templates its tests read by relative path), turns off its model downloads, and runs
it with LLAMA_SERVER_BIN_PATH naming a wrapper around tools/llama_adapter.py. The
suite waits 60 s for a server to answer /health; ckptd loading its model on a loaded
machine takes longer (36 s to listen at a 1-minute load of 26), so the tool sets that
wait, the suite's DEFAULT_HTTP_TIMEOUT (read only by ServerProcess.start; request
timeouts stay the suite's), to --start-timeout (default 300 s). Tests
listed in tools/llama_suite_exclude.txt are left out (tools/llama_suite_plugin.py);
each line there gives its reason. The run ends with a line of figures:
"ckptd: P of N passed (x%) ...".
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

from ckptd.tools.fetch_llamacpp import _download
from ckptd.tools.llama_suite_plugin import DEFAULT as EXCLUDE
from ckptd.tools.llama_suite_plugin import EXCLUDE_ENV
from ckptd.tools.llama_suite_plugin import exclusions as _exclusions

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "ckptd.tools.llama_suite_plugin"
_VENDOR = "vendor/llama.cpp/"
# test_security.py's media-path test reads llama.cpp's own test picture
_KEEP = ("tools/server/tests/", "models/templates/", "tools/mtmd/test-1.jpeg")
TESTS = "tools/server/tests"
# utils.py imports `wget` for downloads; the suite runs offline against ckptd's model
_NO_WGET = '"""Downloads are off: the suite runs against ckptd\'s own model."""\n\n\n' \
           'def download(url, out=None):\n' \
           '    raise RuntimeError(f"downloads are off in this run: {url}")\n'


def fetch(dest: Path) -> Path:
    """The suite's tests folder (extracted once), with downloads turned off."""
    root = dest / "llama-server-suite"
    tests = root / TESTS
    if (tests / "utils.py").is_file() and (root / _KEEP[-1]).is_file():
        return tests
    if root.exists():                       # extracted by an older build: again, whole
        shutil.rmtree(root)
    sdist = _download(dest / "cache")
    tmp = root.with_name(root.name + ".partial")
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            rel = m.name.split("/", 1)[1] if "/" in m.name else ""
            if not (m.isfile() and rel.startswith(_VENDOR)):
                continue
            rel = rel[len(_VENDOR):]
            if rel.startswith(_KEEP):
                m.name = rel
                members.append(m)
        tar.extractall(tmp, members=members, filter="data")
    conftest = tmp / TESTS / "conftest.py"
    text = conftest.read_text()
    conftest.write_text(text.replace("        ServerPreset.load_all()",
                                     "        pass  # ckptd: no model downloads"))
    (tmp / TESTS / "wget.py").write_text(_NO_WGET)
    tmp.rename(root)
    return tests


def fetch_templates(dest: Path) -> Path:
    """llama.cpp's chat templates (models/templates), extracted with the suite."""
    return fetch(dest).parents[2] / "models" / "templates"


def exclusions(path: Path = EXCLUDE) -> dict[str, str]:
    return _exclusions(path)


def wrapper(folder: Path) -> Path:
    """An executable that starts ckptd through the adapter, for LLAMA_SERVER_BIN_PATH."""
    path = folder / "ckptd-as-llama-server"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} -m ckptd.tools.llama_adapter \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def command(extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", PLUGIN, "-q",
            "-rfE", *(extra or ["unit"])]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(suite: Path, model: str | None, base: dict[str, str],
                lora: str | None = None, mmproj: str | None = None) -> dict[str, str]:
    """The suite's environment: its servers on a free port (the suite's default, 8080,
    may be another server's, whose answers would then be taken for ckptd's), ckptd's
    model, and nothing of the caller's pytest run."""
    env = {k: v for k, v in base.items() if not k.startswith(("PYTEST_", "LLAMA_"))}
    env.update(LLAMA_SERVER_BIN_PATH=str(wrapper(suite)), PORT=str(free_port()),
               PYTHONPATH=os.pathsep.join(p for p in (str(suite), base.get("PYTHONPATH"))
                                          if p))
    env[EXCLUDE_ENV] = str(EXCLUDE)
    if model:
        env["CKPTD_SUITE_MODEL"] = str(Path(model).resolve())
    if lora:
        env["CKPTD_SUITE_LORA"] = str(Path(lora).resolve())
    if mmproj:
        env["CKPTD_SUITE_MMPROJ"] = str(Path(mmproj).resolve())
    return env


# files the suite's tests download before they start a server, and pass on only as a
# flag's value (the adapter replaces the model they name): stand-ins let them start
_STAND_INS = ("stories15M-q4_0.gguf",)     # test_speculative.py's draft model


def stand_ins(suite: Path) -> None:
    """utils.download_file returns ./tmp/NAME when it exists: put a stand-in there."""
    (suite / "tmp").mkdir(exist_ok=True)
    for name in _STAND_INS:
        path = suite / "tmp" / name
        if not path.exists():
            path.write_text("a stand-in: the adapter serves ckptd's model instead\n")


START_TIMEOUT = 300
_START_LINE = re.compile(r"^DEFAULT_HTTP_TIMEOUT = \d+$", re.M)


def start_timeout(suite: Path, seconds: int) -> None:
    """Set how long the suite waits for a server to start (its DEFAULT_HTTP_TIMEOUT,
    the default of ServerProcess.start only), each run, as --start-timeout says."""
    utils = suite / "utils.py"
    text, n = _START_LINE.subn(f"DEFAULT_HTTP_TIMEOUT = {seconds}", utils.read_text())
    if n != 1:
        raise RuntimeError(f"{utils}: no DEFAULT_HTTP_TIMEOUT line to set")
    utils.write_text(text)


def run(extra: list[str], model: str | None, dest: Path, lora: str | None = None,
        mmproj: str | None = None, start: int = START_TIMEOUT) -> int:
    suite = fetch(dest)
    stand_ins(suite)
    start_timeout(suite, start)
    return subprocess.call(command(extra), cwd=suite,
                           env=environment(suite, model, dict(os.environ), lora, mmproj))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model for ckptd (default: SmolLM2)")
    p.add_argument("--dest", type=Path, default=ROOT / "third_party")
    p.add_argument("--lora", default=None,
                   help="LoRA adapter for ckptd's model, served where a test loads the "
                        "suite's own (ckptd make-lora MODEL OUT writes one)")
    p.add_argument("--mmproj", default=None,
                   help="vision tower (mmproj GGUF) for a GGUF --model, served where a test "
                        "starts the suite's multimodal model (an HF folder brings its own)")
    p.add_argument("--start-timeout", type=int, default=START_TIMEOUT,
                   help="seconds the suite waits for each server to start (the suite's "
                        f"own is 60; default {START_TIMEOUT})")
    args, extra = p.parse_known_args(argv)
    try:
        return run(extra, args.model, args.dest, args.lora, args.mmproj,
                   args.start_timeout)
    except (RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

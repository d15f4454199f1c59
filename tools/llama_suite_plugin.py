"""A pytest plugin for llama.cpp's server tests run against ckptd (`-p` loads it):
leaves out the tests tools/llama_suite_exclude.txt lists, by exact id, and ends the
run with the figures docs/COMPATIBILITY.md records.

An entry names a file, a test (every parametrization of it) or one parametrized id.
pytest's own --deselect matches by prefix, so `test_completion` would also drop
`test_completion_stream`; this matches whole ids only.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

EXCLUDE_ENV = "LLAMA_SUITE_EXCLUDE"
DEFAULT = Path(__file__).with_name("llama_suite_exclude.txt")


def exclusions(path: Path = DEFAULT) -> dict[str, str]:
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


def match(nodeid: str, excluded: dict[str, str]) -> str | None:
    """The entry that leaves this test out, or None."""
    if nodeid in excluded:
        return nodeid
    base = nodeid.split("[", 1)[0]            # every parametrization of a listed test
    if base in excluded:
        return base
    file = nodeid.split("::", 1)[0]
    return file if file in excluded else None


class _Exclude:
    def __init__(self, excluded: dict[str, str]) -> None:
        self.excluded = excluded
        self.left_out: Counter = Counter()     # reason category -> tests
        self.results: dict[str, str] = {}      # test id -> passed, skipped or failed

    def pytest_collection_modifyitems(self, config, items) -> None:
        keep, drop = [], []
        for item in items:
            entry = match(item.nodeid, self.excluded)
            if entry is None:
                keep.append(item)
            else:
                drop.append(item)
                self.left_out[self.excluded[entry].split(":", 1)[0]] += 1
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_runtest_logreport(self, report) -> None:
        # a test's worst phase decides: an error in setup or teardown fails it
        rank = {"passed": 0, "skipped": 1, "failed": 2}
        if report.when == "call" or report.outcome != "passed":
            was = self.results.get(report.nodeid, "passed")
            self.results[report.nodeid] = max(was, report.outcome, key=rank.__getitem__)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        n = Counter(self.results.values())
        run = n["passed"] + n["failed"]
        share = 100.0 * n["passed"] / run if run else 0.0
        left = ", ".join(f"{k} {why}" for why, k in self.left_out.most_common())
        terminalreporter.write_line(
            f"ckptd: {n['passed']} of {run} passed ({share:.1f}%), "
            f"{n['skipped']} skipped; left out: "
            f"{sum(self.left_out.values())} ({left or 'none'})")


def pytest_configure(config) -> None:
    path = Path(os.environ.get(EXCLUDE_ENV) or DEFAULT)
    config.pluginmanager.register(_Exclude(exclusions(path)), "ckptd-exclude")

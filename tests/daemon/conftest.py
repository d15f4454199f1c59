"""One tiny-hybrid daemon shared by the HTTP API and bad-input tests."""

from __future__ import annotations

import pytest

from tests.daemon.daemon_proc import start
from tests.daemon.engines import check_and_close_all

MAX_CONTEXT = 512
MAX_BODY = 64 * 1024


@pytest.fixture(scope="session")
def daemon(tiny_hybrid_dir, tmp_path_factory):
    d = start(tiny_hybrid_dir, tmp_path_factory.mktemp("daemon") / "cache",
              "--max-context", str(MAX_CONTEXT), "--parallel", "4", "--step-tokens", "64",
              "--snapshot-interval", "64", "--max-body", str(MAX_BODY),
              "--request-timeout", "60")
    yield d
    code = d.stop()
    assert code == 0, d.output()


@pytest.fixture(autouse=True)
def _check_engines():
    """Every in-process engine a test made: stopped, its cache's invariants checked, closed."""
    yield
    check_and_close_all()

"""ckptd's processes wait for OpenMP work passively unless the user chose otherwise
(tools/openmp.py): spinning threads cost a shared machine's cores."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ckptd.tools.openmp import wait_passively


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    return monkeypatch


def test_passive_by_default(clean_env):
    wait_passively()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


@pytest.mark.parametrize("name, value", [("OMP_WAIT_POLICY", "ACTIVE"),
                                         ("GOMP_SPINCOUNT", "10000")])
def test_the_users_choice_is_kept(clean_env, name, value):
    clean_env.setenv(name, value)
    wait_passively()
    assert os.environ.get("OMP_WAIT_POLICY") == (value if name == "OMP_WAIT_POLICY" else None)


def test_the_command_sets_it_before_torch_loads():
    # `ckptd generate --help` imports the command's module (not torch); the policy must
    # be in the environment by then, which libgomp reads when torch loads it
    code = ("import os, sys; from ckptd.tools import cli; sys.argv = ['ckptd', 'generate', "
            "'--help']; import contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):"
            " cli.main()\n"
            "print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["PASSIVE", "False"]

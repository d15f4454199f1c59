"""Benchmarks (`python -m ckptd.tools.bench.NAME`); their processes wait for OpenMP
work passively, as the `ckptd` command's do (tools/openmp.py)."""

from __future__ import annotations

from ckptd.tools.openmp import wait_passively

wait_passively()

"""kernels.dispatch picks the implementation per call; the kernel benchmark runs."""

from __future__ import annotations

import json

import pytest
import torch

from ckptd.kernels import dispatch, ops
from ckptd.tools.bench import kernels as bench_kernels


def test_modes(monkeypatch):
    x = torch.zeros(2)
    monkeypatch.setattr(dispatch, "MODE", "torch")
    assert not dispatch.use_triton(x)
    monkeypatch.setattr(dispatch, "MODE", "auto")
    assert dispatch.use_triton(x) == x.is_cuda
    monkeypatch.setattr(dispatch, "MODE", "auto")
    assert dispatch.use_triton(x) == x.is_cuda
    monkeypatch.setattr(dispatch, "MODE", "triton")
    assert dispatch.use_triton(x)
    monkeypatch.setattr(dispatch, "MODE", "cuda")
    with pytest.raises(ValueError, match="CKPTD_KERNELS"):
        dispatch.use_triton(x)


def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setattr(dispatch, "MODE", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        dispatch.use_triton(torch.zeros(2))


def test_torch_mode_runs_the_reference(monkeypatch):
    # the Triton launcher wants weight [D]; the reference broadcasts a [1] weight
    x, w = torch.randn(5, 8), torch.tensor([2.0])
    monkeypatch.setattr(dispatch, "MODE", "torch")
    assert dispatch.rms_norm(x, w, 1e-6).shape == (5, 8)
    monkeypatch.setattr(dispatch, "MODE", "triton")
    with pytest.raises(ValueError, match="weight"):
        dispatch.rms_norm(x, w, 1e-6)


def test_ops_exports_the_dispatching_functions():
    for name in ops.__all__:
        assert getattr(ops, name) is getattr(dispatch, name)


def test_bench_smoke_runs_every_kernel(tmp_path):
    out = tmp_path / "bench.json"
    assert bench_kernels.main(["--smoke", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    triton_ops = {r["op"] for r in rows if r["impl"] == "triton" and "error" not in r}
    assert triton_ops == {r["op"] for r in rows}
    assert all(r["ms"] > 0 for r in rows if "error" not in r)

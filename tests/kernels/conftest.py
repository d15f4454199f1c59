"""Kernel tests run Triton on CUDA, or interpreted on the CPU; unwritten outputs show.

TRITON_INTERPRET must be set before the first `triton.jit` runs, so it is set
here, at import, when there is no GPU. Kernel test modules use the `triton_env`
fixture: dispatch.MODE = "triton" (kernels.dispatch takes the Triton path on CPU
tensors too) and torch.empty / torch.empty_like filled with NaN, so an output
element a kernel forgets to write fails the comparison instead of passing by luck.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from ckptd.kernels import dispatch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _nan_filled(make):
    def wrapped(*args, **kwargs):
        t = make(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t
    return wrapped


@pytest.fixture
def triton_env(monkeypatch):
    monkeypatch.setattr(dispatch, "MODE", "triton")
    monkeypatch.setattr(torch, "empty", _nan_filled(torch.empty))
    monkeypatch.setattr(torch, "empty_like", _nan_filled(torch.empty_like))


@pytest.fixture
def device():
    return DEVICE


def _close(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-5) -> bool:
    """Equal up to tol relative to the reference's largest magnitude, and finite."""
    got, want = got.float().cpu(), want.float().cpu()
    if got.shape != want.shape or not torch.isfinite(got).all():
        return False
    return (got - want).abs().max().item() <= tol * max(1.0, want.abs().max().item())


@pytest.fixture
def close():
    return _close

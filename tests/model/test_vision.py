"""Image input pieces against transformers: the processor's pixels and grid, M-RoPE
positions, the rotary tables; and the bounds on what an image may be."""

from __future__ import annotations

import json

import pytest
import torch

from ckptd.kernels.rotary.naive import mrope_cos_sin, rotary_cos_sin
from ckptd.model.vision.config import Processing, VisionConfig
from ckptd.model.vision.image import ImageError, Limits, decode, patches, prepare, smart_resize
from ckptd.model.vision.positions import (
    ImageSpan,
    check_spans,
    chunk_positions,
    inside,
    next_position,
)
from tests.images import encoded, picture

_PRE = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "size": {"shortest_edge": 32 * 32 * 8, "longest_edge": 32 * 32 * 300}}


@pytest.mark.parametrize("size,mode", [((300, 200), "RGB"), ((97, 131), "RGBA"),
                                       ((1000, 90), "L"), ((640, 480), "P"),
                                       ((40, 33), "RGB"), ((2000, 1500), "RGB")])
def test_pixels_equal_the_processor(size, mode):
    """Qwen2VLImageProcessorPil (what transformers gives Qwen3.5 without torchvision):
    the same grid and bit-equal pixel values, resize bounds both ways included."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )
    hf = Qwen2VLImageProcessorPil(**_PRE)
    proc = Processing.from_hf(_PRE)
    img = picture(*size, seed=sum(size), mode=mode)
    want = hf(images=[img], return_tensors="pt")
    got = prepare(img, proc)
    assert list(got.grid) == want["image_grid_thw"][0].tolist()
    assert torch.equal(patches(got, proc), want["pixel_values"])


def test_resize_bounds_and_aspect():
    assert smart_resize(10, 10, 32, 32 * 32 * 4, 32 * 32 * 100) == (64, 64)    # up to the floor
    h, w = smart_resize(5000, 3000, 32, 1024, 32 * 32 * 100)
    assert h * w <= 32 * 32 * 100 and h % 32 == 0 and w % 32 == 0
    with pytest.raises(ImageError, match="aspect ratio"):
        smart_resize(10, 2500, 32, 1024, 10 ** 8)


def test_digest_names_the_pixels():
    proc = Processing.from_hf(_PRE)
    png, jpeg_same = encoded(64, 48, seed=3), encoded(64, 48, seed=3, fmt="BMP")
    a, b = prepare(decode(png), proc), prepare(decode(jpeg_same), proc)
    assert a.digest == b.digest                       # same pixels, another container
    c = prepare(decode(encoded(64, 48, seed=4)), proc)
    assert c.grid == a.grid and c.digest != a.digest   # same size, other pixels


def test_bad_images_are_refused():
    with pytest.raises(ImageError, match="cannot decode"):
        decode(b"not an image at all")
    with pytest.raises(ImageError, match="empty"):
        decode(b"")
    with pytest.raises(ImageError, match="image-max-bytes"):
        decode(encoded(64, 64), Limits(max_bytes=100))
    with pytest.raises(ImageError, match="image-max-side"):
        decode(encoded(300, 20), Limits(max_side=256))
    with pytest.raises(ImageError, match="image-max-pixels"):
        decode(encoded(100, 100), Limits(max_pixels=5000))
    with pytest.raises(ImageError, match="cannot decode"):
        decode(encoded(64, 64)[:60])                   # truncated


def test_config_is_checked():
    good = {"vision_config": {"depth": 1, "hidden_size": 32, "num_heads": 2,
                              "intermediate_size": 64, "out_hidden_size": 64,
                              "num_position_embeddings": 16}}
    assert VisionConfig.from_hf(good).head_dim == 16
    assert VisionConfig.from_hf({"model_type": "qwen3_5"}) is None
    with pytest.raises(ValueError, match="num_position_embeddings must be a square"):
        VisionConfig.from_hf({"vision_config": {**good["vision_config"],
                                                "num_position_embeddings": 15}})
    with pytest.raises(ValueError, match="missing 'depth'"):
        VisionConfig.from_hf({"vision_config": {"hidden_size": 32}})
    with pytest.raises(ValueError, match="merge sizes"):
        VisionConfig.from_hf(good, {"merge_size": 4})
    with pytest.raises(ValueError, match="min_pixels exceeds"):
        Processing.from_hf({"size": {"shortest_edge": 10 ** 6, "longest_edge": 10}})


def test_mrope_with_equal_positions_is_rope():
    pos = torch.arange(50) * 3 + 7
    for sections in ((2, 1, 1), (11, 11, 10), (1, 1, 0)):
        dim = 2 * sum(sections)
        a = mrope_cos_sin(pos.expand(3, -1), dim, 10000.0, sections)
        b = rotary_cos_sin(pos, dim, 10000.0)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_mrope_matches_transformers():
    """Qwen3_5TextRotaryEmbedding on distinct (t, h, w) positions."""
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10]}
    emb = Qwen3_5TextRotaryEmbedding(Qwen3_5TextConfig(head_dim=256, rope_parameters=rope))
    pos = torch.randint(0, 5000, (3, 1, 40), generator=torch.Generator().manual_seed(0))
    cos, sin = emb(torch.zeros(1, dtype=torch.float32), pos)
    got = mrope_cos_sin(pos[:, 0], 64, 1e7, (11, 11, 10))
    assert torch.allclose(got[0], cos[0], atol=1e-6) and torch.allclose(got[1], sin[0], atol=1e-6)


def _spans(tokens, image_id, grids):
    out, at = [], 0
    for g in grids:
        s = tokens.index(image_id, at)
        out.append(ImageSpan(s, g, 2, bytes(32)))
        at = out[-1].end
    return tuple(out)


def test_positions_match_get_rope_index(tiny_vision):
    """Every token's three positions, images of different shapes, text between and
    after: transformers' Qwen3_5Model.get_rope_index; and any chunking of them."""
    from transformers import AutoModelForImageTextToText

    folder = tiny_vision()[0]
    cfg = json.loads((folder / "config.json").read_text())
    img, vs, ve = cfg["image_token_id"], cfg["vision_start_token_id"], cfg["vision_end_token_id"]
    grids = [(1, 4, 6), (1, 10, 2), (1, 2, 2)]
    tokens = [9] * 5
    for t, h, w in grids:
        tokens += [vs] + [img] * (t * h * w // 4) + [ve] + [11] * 3
    ref = AutoModelForImageTextToText.from_pretrained(folder).eval()
    ids = torch.tensor([tokens])
    want, delta = ref.model.get_rope_index(ids, (ids == img).int(), torch.tensor(grids))
    spans = _spans(tokens, img, grids)
    check_spans(spans, len(tokens), img, tokens)
    shift, got = chunk_positions(spans, 0, len(tokens))
    assert shift == 0 and torch.equal(got, want[:, 0])
    assert next_position(spans, len(tokens)) == len(tokens) + int(delta)
    for cut in (3, spans[0].start, spans[0].end, spans[1].start + 5, len(tokens) - 2):
        parts = [chunk_positions(spans, a, b) for a, b in ((0, cut), (cut, len(tokens)))]
        rows = [p if p is not None else (torch.arange(a, b) + s).expand(3, -1)
                for (s, p), (a, b) in zip(parts, ((0, cut), (cut, len(tokens))))]
        assert torch.equal(torch.cat(rows, dim=1), want[:, 0]), cut
    assert inside(spans, spans[0].start) is None and inside(spans, spans[0].end) is None
    assert inside(spans, spans[0].start + 1) is spans[0]
    with pytest.raises(ValueError, match="without an image"):
        check_spans(spans[:2], len(tokens), img, tokens)

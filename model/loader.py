"""Load a model from a Hugging Face folder (config.json + safetensors) or a GGUF file.

The model is built on the meta device, then every parameter is assigned from the
checkpoint after its name and shape are checked, so a bad checkpoint fails with
the tensor's name instead of a half-initialised model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ckptd.model.arch.decoder import CausalLM
from ckptd.model.config import ModelConfig
from ckptd.model.fingerprint import model_fingerprint

# Prefixes real checkpoints put around the text model's tensors.
_RENAMES = (("model.language_model.", "model."),)
_SKIP = ("mtp.", "model.visual.", "visual.")


def load(path: str | Path, dtype: torch.dtype | None = None,
         device: str | torch.device = "cpu"):
    """(model, tokenizer) from an HF folder or a .gguf file, reading a GGUF once."""
    from ckptd.model.text.tokenizer import Tokenizer
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        from ckptd.model.gguf.load import open_gguf
        reader = open_gguf(path)
        return load_model(path, dtype, device, reader), Tokenizer.from_gguf(reader)
    model = load_model(path, dtype, device)
    return model, Tokenizer.from_dir(path)


def load_model(path: str | Path, dtype: torch.dtype | None = None,
               device: str | torch.device = "cpu", gguf_reader=None) -> CausalLM:
    """A ready CausalLM from an HF folder or a .gguf file; fp32 unless dtype says otherwise."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"model path does not exist: {path}")
    if path.is_file() and path.suffix == ".gguf":
        from ckptd.model.gguf.load import load_gguf
        hf_config, tensors = load_gguf(path, gguf_reader)
        files = [path]
    elif path.is_dir():
        hf_config = _read_config(path)
        files = _weight_files(path)
        tensors = _read_safetensors(files)
    else:
        raise ValueError(f"not a model folder or a .gguf file: {path}")
    cfg = ModelConfig.from_hf(hf_config)
    dtype = dtype or torch.float32
    model = build(cfg, tensors, dtype, device)
    model.fingerprint = model_fingerprint(cfg, files, dtype)
    return model


def build(cfg: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
          device: str | torch.device = "cpu") -> CausalLM:
    """Assign checkpoint tensors (HF names) to a model built on the meta device."""
    with torch.device("meta"):
        model = CausalLM(cfg)
    tensors = _normalize(tensors)
    if "lm_head.weight" not in tensors and cfg.tie_word_embeddings:
        tensors["lm_head.weight"] = tensors.get("model.embed_tokens.weight")
    expected = model.state_dict()
    missing = [n for n in expected if tensors.get(n) is None]
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensor(s), first: {missing[0]}")
    state = {}
    for name, meta in expected.items():
        t = tensors[name]
        if tuple(t.shape) != tuple(meta.shape):
            raise ValueError(f"tensor {name} has shape {tuple(t.shape)}, "
                             f"expected {tuple(meta.shape)}")
        state[name] = t.to(device=device, dtype=dtype)
    model.load_state_dict(state, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.fuse()
    return model.eval()


def _read_config(folder: Path) -> dict:
    f = folder / "config.json"
    if not f.exists():
        raise FileNotFoundError(f"no config.json in {folder}")
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{f} is not valid JSON: {e}") from None


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / n for n in names]
        absent = [f for f in files if not f.exists()]
        if absent:
            raise FileNotFoundError(f"shard listed in {index.name} is missing: {absent[0]}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    return files


def _read_safetensors(files: list[Path]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    out[name] = fh.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise ValueError(f"cannot read {f} (truncated or not safetensors?): {e}") from None
    return out


def _normalize(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in tensors.items():
        for old, new in _RENAMES:
            if name.startswith(old):
                name = new + name[len(old):]
        if not name.startswith(_SKIP):
            out[name] = t
    return out

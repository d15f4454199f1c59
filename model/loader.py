"""Load a model from a Hugging Face folder (config.json + safetensors) or a GGUF file.

The architecture is checked first, from config.json or the GGUF header, so an
unsupported model is refused before any weight is read. The model is then built on
the meta device and every parameter is assigned from the checkpoint after its name
and shape are checked, so a bad checkpoint fails with the tensor's name instead of a
half-initialised model. Weights are memory-mapped and read one parameter at a time
(model/weights.py, model/checkpoint.py): a tensor already in the model's dtype is
used in place, and a load holds about one tensor besides the model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ckptd.model.arch.decoder import CausalLM
from ckptd.model.arch.gemma import GemmaLM
from ckptd.model.arch.gpt_oss import GptOssLM, from_hf_layout
from ckptd.model.arch.ssm_lm import HybridLM
from ckptd.model.checkpoint import Recipe, adapt, plain
from ckptd.model.config import ModelConfig
from ckptd.model.configs import config_from_hf
from ckptd.model.fingerprint import kv_fingerprint, model_fingerprint
from ckptd.model.gemma_config import GemmaConfig
from ckptd.model.gguf.load import check_architecture, gguf_recipes, open_gguf
from ckptd.model.gpt_oss_config import GptOssConfig
from ckptd.model.kept_swap import attach_kept, use_gemv_activations
from ckptd.model.placement import stray_tensors
from ckptd.model.quant import is_kept
from ckptd.model.ssm_checkpoint import rename
from ckptd.model.ssm_config import SSMConfig
from ckptd.model.text.tokenizer import Tokenizer
from ckptd.model.weights import SafetensorsSource

WEIGHTS = ("keep", "expand")


def load(path: str | Path, dtype: torch.dtype | None = None,
         device: str | torch.device = "cpu", weights: str = "keep",
         kv_dtype: torch.dtype | None = None, gemv_activations: str = "fp32"):
    """(model, tokenizer) from an HF folder or a .gguf file, reading a GGUF once.
    weights: "keep" serves a GGUF's quantized / F16 / BF16 tensors in their formats
    (model/quant.py), "expand" converts every tensor to `dtype` at load. kv_dtype: the
    attention layers' KV (None: the compute dtype; use_kv_dtype). gemv_activations:
    "fp32" or "q8", how a decode step's kept matmuls take their input
    (model/kept_swap.py: use_gemv_activations)."""
    path = Path(path)
    if _is_gguf(path):
        check_architecture(path)
        reader = open_gguf(path)
        model, tok = load_model(path, dtype, device, reader, weights), \
            Tokenizer.from_gguf(reader)
    else:
        model, tok = load_model(path, dtype, device), Tokenizer.from_dir(path)
    use_kv_dtype(model, kv_dtype)
    use_gemv_activations(model, gemv_activations)
    return model, tok


def use_kv_dtype(model: CausalLM, kv_dtype: torch.dtype | None) -> None:
    """Keep the model's attention KV in kv_dtype (None, or the compute dtype: as computed),
    and fold it into the model's fingerprint: pages of one KV dtype never restore into a
    pool of another (the store, the remote tier and the host copies key by it).

    Other than the compute dtype only fp16 with an fp32 model on the CPU, as llama.cpp
    keeps it (half the bytes a long context's decode step reads: cpu.c converts on
    load); the GPU kernels read KV in the compute dtype. ValueError otherwise."""
    if kv_dtype is None or kv_dtype == model.dtype:
        return
    if kv_dtype != torch.float16 or model.dtype != torch.float32 \
            or model.device.type != "cpu":
        raise ValueError(f"--kv-dtype {str(kv_dtype).removeprefix('torch.')}: only float16 "
                         f"KV with a float32 model on the CPU (this one: "
                         f"{str(model.dtype).removeprefix('torch.')} on {model.device})")
    if model.kv_dtype is not None:
        raise ValueError("the model's KV dtype is already chosen")
    model.kv_dtype = kv_dtype
    model.fingerprint = kv_fingerprint(model.fingerprint, kv_dtype)


def load_model(path: str | Path, dtype: torch.dtype | None = None,
               device: str | torch.device = "cpu", gguf_reader=None,
               weights: str = "keep") -> CausalLM:
    """A ready CausalLM from an HF folder or a .gguf file; fp32 unless dtype says otherwise."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"model path does not exist: {path}")
    dtype = dtype or torch.float32
    if _is_gguf(path):
        if gguf_reader is None:
            check_architecture(path)        # before gguf's reader maps the file
        hf_config, recipes, release = gguf_recipes(path, gguf_reader, weights == "keep")
        files = [path]
        cfg = config_from_hf(hf_config)
    elif path.is_dir():
        cfg = config_from_hf(_read_config(path))   # refuses before a weight is read
        files = _weight_files(path)
        source = SafetensorsSource(files)
        recipes = {n: plain(lambda n=n: source.get(n)) for n in source.names()}
        if isinstance(cfg, GptOssConfig):       # transformers' expert layout
            recipes = from_hf_layout(cfg, recipes)
        release = source.release
    else:
        raise ValueError(f"not a model folder or a .gguf file: {path}")
    model = build(cfg, recipes, dtype, device, release)
    # kept weights multiply in another order than expanded ones: their caches never mix
    model.fingerprint = model_fingerprint(cfg, files, dtype,
                                          weights if _is_gguf(path) else "expand")
    return model


def build(cfg: ModelConfig, tensors: dict[str, torch.Tensor | Recipe], dtype: torch.dtype,
          device: str | torch.device = "cpu",
          release: Callable[..., None] = lambda everything=False: None) -> CausalLM:
    """Assign checkpoint tensors (HF names; tensors or recipes) to a model built on the
    meta device. `release()` is called after each parameter (the source drops the
    pages it read for it) and `release(everything=True)` once the model is built."""
    device = torch.device(device)
    with torch.device("meta"):
        model = causal_lm(cfg)
    with _one_thread():
        return _assign(cfg, model, tensors, dtype, device, release)


def causal_lm(cfg: ModelConfig) -> CausalLM:
    """The model class of cfg's architecture (a state space hybrid: arch/ssm_lm.py;
    Gemma 3: arch/gemma.py; gpt-oss: arch/gpt_oss.py)."""
    if isinstance(cfg, SSMConfig):
        return HybridLM(cfg)
    if isinstance(cfg, GemmaConfig):
        return GemmaLM(cfg)
    if isinstance(cfg, GptOssConfig):
        return GptOssLM(cfg)
    return CausalLM(cfg)


@contextmanager
def _one_thread() -> Iterator[None]:
    """Loading is copies and dtype conversions, bound by memory: a second OpenMP thread
    adds nothing, and on a busy machine the two wait on each other (docs/BENCHMARKS.md:
    a MoE checkpoint's load)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _assign(cfg: ModelConfig, model: CausalLM, tensors: dict, dtype: torch.dtype,
            device: torch.device, release: Callable[..., None]) -> CausalLM:
    recipes = adapt(cfg, {n: t if callable(t) else _given(t) for n, t in tensors.items()},
                    rename if isinstance(cfg, SSMConfig) else None)
    tied = cfg.tie_word_embeddings      # lm_head is the embedding, whatever is stored
    expected = {n: m for n, m in model.state_dict().items()
                if not (tied and n == "lm_head.weight")}
    missing = [n for n in expected if n not in recipes]
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensor(s), first: {missing[0]}")
    state, kept = {}, {}
    for name, meta in expected.items():
        t = recipes.pop(name)(dtype, device)
        if is_kept(t):
            t = t.to(device)        # kept bytes are file views: onto the model's device
        release()
        if tuple(t.shape) != tuple(meta.shape):
            raise ValueError(f"tensor {name} has shape {tuple(t.shape)}, "
                             f"expected {tuple(meta.shape)}")
        (kept if is_kept(t) else state)[name] = t
    if tied:
        for d in (state, kept):
            if "model.embed_tokens.weight" in d:
                d["lm_head.weight"] = d["model.embed_tokens.weight"]
    state.update(attach_kept(model, kept, dtype))      # swaps the kept ones' modules
    model.load_state_dict(state, assign=True)
    del state
    if tied and "lm_head.weight" not in kept:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.fuse()
    release(everything=True)
    strays = stray_tensors(model, device)
    if strays:
        raise RuntimeError(f"{len(strays)} tensor(s) of the model are not on {device}, "
                           f"first: {strays[0]}")
    return model.eval()


def _given(t: torch.Tensor) -> Recipe:
    return lambda dtype, device: t.to(device=device, dtype=dtype)


def _is_gguf(path: Path) -> bool:
    return path.is_file() and path.suffix == ".gguf"


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
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{index} is not a safetensors index: {e!r}") from None
        files = [folder / n for n in names]
        absent = [f for f in files if not f.exists()]
        if absent:
            raise FileNotFoundError(f"shard listed in {index.name} is missing: {absent[0]}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    return files

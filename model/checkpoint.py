"""A checkpoint's tensors under the model's parameter names, loaded on demand.

Hugging Face checkpoints of one architecture come in more than one layout; this turns
them into the one the model holds (arch/), as recipes that run when the loader
assigns each parameter, so no tensor is read or converted before it is needed:

- the text model of a multimodal checkpoint (`model.language_model.*`) is the model;
  the vision tower (loaded apart: model/vision/load.py) and multi-token-prediction
  layers are skipped here (one log line each);
- experts stored one tensor per expert (`mlp.experts.{j}.gate_proj.weight`, ...: the
  Hub's layout, which transformers merges when it loads) are stacked into
  `mlp.experts.gate_up_proj` [E, 2I, H] and `mlp.experts.down_proj` [E, H, I];
  checkpoints already holding those 3-D tensors are taken as they are;
- Qwen3-Next's fused, per-key-head interleaved `in_proj_qkvz` and `in_proj_ba` are
  split into Qwen3.5's `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`;
- the state space hybrids' names are the model's after model/ssm_checkpoint.py (the
  loader passes its `rename`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from ckptd.model.config import ModelConfig

log = logging.getLogger("ckptd.model")

# (dtype, device) -> the tensor in that dtype on that device
Recipe = Callable[[torch.dtype, torch.device], torch.Tensor]

_RENAMES = (("model.language_model.", "model."),)
_MTP = "multi-token-prediction layers"
_SKIPS = (("mtp.", _MTP), ("model.mtp.", _MTP), ("model.visual.", "vision tower"),
          ("visual.", "vision tower"))


class plain:
    """A tensor that is used as stored (converted to the model's dtype and device).
    `raw()` is the stored tensor itself: recipes that copy it into a larger tensor read
    it from there, converting on the fly instead of through a temporary."""

    def __init__(self, get: Callable[[], torch.Tensor]) -> None:
        self.raw = get

    def __call__(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.raw().to(device=device, dtype=dtype)


def copy_into(dst: torch.Tensor, recipe: Recipe, what: str) -> None:
    """dst.copy_(the recipe's tensor); ValueError naming `what` on a shape mismatch."""
    src = recipe.raw() if isinstance(recipe, plain) else recipe(dst.dtype, dst.device)
    if tuple(src.shape) != tuple(dst.shape):
        raise ValueError(f"{what} has shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
    dst.copy_(src)


def normalize(recipes: dict[str, Recipe]) -> dict[str, Recipe]:
    """Text-model names; skipped groups are logged once each."""
    out: dict[str, Recipe] = {}
    skipped: dict[str, int] = {}
    for name, r in recipes.items():
        for old, new in _RENAMES:
            if name.startswith(old):
                name = new + name[len(old):]
        what = next((w for p, w in _SKIPS if name.startswith(p)), None)
        if what is not None:
            skipped[what] = skipped.get(what, 0) + 1
            continue
        out[name] = r
    for what, n in skipped.items():
        log.info("the text model skips the checkpoint's %s (%d tensors)", what, n)
    return out


Rename = Callable[[ModelConfig, dict[str, Recipe]], dict[str, Recipe]]


def adapt(cfg: ModelConfig, recipes: dict[str, Recipe],
          rename: Rename | None = None) -> dict[str, Recipe]:
    """Recipes under the model's names (see the module docstring); `rename`, an
    architecture's own names onto the model's (ssm_checkpoint.rename), runs before
    experts are stacked."""
    out = normalize(recipes)
    if rename is not None:
        out = rename(cfg, out)
    for i, kind in enumerate(cfg.mlp_types):
        if kind == "moe":
            _stack_experts(cfg, out, f"model.layers.{i}.mlp.experts.")
    if cfg.arch == "qwen3_next":
        for i, kind in enumerate(cfg.layer_types):
            if kind == "linear_attention":
                _split_qwen3_next(cfg, out, f"model.layers.{i}.linear_attn.")
    return out


def _stack_experts(cfg: ModelConfig, out: dict[str, Recipe], p: str) -> None:
    E = cfg.num_experts
    if p + "gate_up_proj" in out and p + "down_proj" in out:
        return
    names = {w: [f"{p}{j}.{w}.weight" for j in range(E)]
             for w in ("gate_proj", "up_proj", "down_proj")}
    absent = [n for ns in names.values() for n in ns if n not in out]
    if absent:
        # build() names the missing parameter; say which expert tensor was absent
        if any(n in out for ns in names.values() for n in ns):
            raise ValueError(f"checkpoint is missing expert tensor {absent[0]}")
        return
    gate, up, down = ([out.pop(n) for n in names[w]] for w in ("gate_proj", "up_proj", "down_proj"))

    def stack(dtype, device, parts, shape):
        dst = torch.empty(E, *shape, dtype=dtype, device=device)
        rows = 0
        for recipes in parts:
            n = _shape(recipes[0], dtype, device)[0]
            for j in range(E):
                copy_into(dst[j, rows:rows + n], recipes[j], f"expert {j} of {p[:-1]}")
            rows += n
        return dst

    def gate_up(dtype, device):
        inter, hidden = _shape(gate[0], dtype, device)
        return stack(dtype, device, [gate, up], (2 * inter, hidden))

    def down_proj(dtype, device):
        return stack(dtype, device, [down], _shape(down[0], dtype, device))

    out[p + "gate_up_proj"] = gate_up
    out[p + "down_proj"] = down_proj


def _shape(recipe: Recipe, dtype, device) -> tuple[int, ...]:
    return tuple((recipe.raw() if isinstance(recipe, plain) else recipe(dtype, device)).shape)


def _split_qwen3_next(cfg: ModelConfig, out: dict[str, Recipe], p: str) -> None:
    """Qwen3-Next keeps, per key head h, [q_h, k_h, v_h (r value heads), z_h (r heads)]
    in in_proj_qkvz and [b_h (r), a_h (r)] in in_proj_ba (transformers:
    Qwen3NextGatedDeltaNet.fix_query_key_value_ordering); Qwen3.5's in_proj_qkv is
    [all q; all k; all v] with value heads grouped by key head, the same order
    Qwen3-Next's conv1d channels are in."""
    hk, r = cfg.linear_num_key_heads, cfg.linear_num_value_heads // cfg.linear_num_key_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    if p + "in_proj_qkvz.weight" in out:
        src = out.pop(p + "in_proj_qkvz.weight")
        width = 2 * dk + 2 * r * dv
        idx = torch.arange(hk * width).view(hk, width)
        q, k, v, z = idx.split([dk, dk, r * dv, r * dv], dim=1)
        out[p + "in_proj_qkv.weight"] = _rows(src, torch.cat([q.flatten(), k.flatten(),
                                                              v.flatten()]))
        out[p + "in_proj_z.weight"] = _rows(src, z.flatten())
    if p + "in_proj_ba.weight" in out:
        src = out.pop(p + "in_proj_ba.weight")
        b, a = torch.arange(hk * 2 * r).view(hk, 2 * r).split([r, r], dim=1)
        out[p + "in_proj_b.weight"] = _rows(src, b.flatten())
        out[p + "in_proj_a.weight"] = _rows(src, a.flatten())


def _rows(src: Recipe, index: torch.Tensor) -> Recipe:
    """Rows `index` of src's tensor (read once per row set: two sets read it twice)."""
    def rows(dtype, device):
        t = src(dtype, device)
        if hasattr(t, "take_rows"):     # a GGUF tensor kept as stored (model/gguf/kept.py)
            return t.take_rows(index)
        return t[index.to(device)].contiguous()
    return rows

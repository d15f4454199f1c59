"""The models of models.py built on the meta device and stepped through STEPS, with
plain weights in a dtype or with weights kept in a GGUF format."""

from __future__ import annotations

import torch

from ckptd.kernels import ops
from ckptd.kernels.quant.formats import FORMATS, QuantTensor
from ckptd.model.arch.decoder import CausalLM
from ckptd.model.batch import SeqChunk, StepBatch
from ckptd.model.configs import config_from_hf
from ckptd.model.loader import build, causal_lm
from ckptd.model.quant import KeptGateUp
from ckptd.model.state import DeviceState
from ckptd.tools.gate.models import STEPS

META = torch.device("meta")
BLOCK = 16          # tokens per KV page (the serve default); a runtime int of every kernel
# stay plain in a GGUF (llama.cpp keeps them F32): norms, the conv, the decay parameters,
# the router and the shared expert's gate (model/quant.py: _PLAIN)
_PLAIN = ("norm.weight", "conv1d.weight", "A_log", "dt_bias", "mlp.gate.weight",
          "shared_expert_gate.weight")


def _kept(shape: tuple[int, ...], fmt: str) -> QuantTensor:
    _, bs, ts = FORMATS[fmt]
    data = torch.empty(*shape[:-1], shape[-1] // bs * ts, dtype=torch.uint8, device=META)
    return QuantTensor(data, fmt, shape)


def meta_model(hf: dict, dtype: torch.dtype, fmt: str | None = None) -> CausalLM:
    """The model on the meta device: every weight in dtype, or (fmt) every 2-D weight and
    the experts kept in that GGUF format, as `--weights keep` serves a GGUF."""
    cfg = config_from_hf(hf)
    with META:
        shapes = {n: tuple(t.shape) for n, t in causal_lm(cfg).state_dict().items()}

    def recipe(name: str, shape: tuple[int, ...]):
        def make(dt, dev):
            if fmt is None or name.endswith(_PLAIN) or len(shape) == 1:
                return torch.empty(shape, dtype=dt, device=dev)
            if name.endswith("experts.gate_up_proj"):
                E, two_i, H = shape
                return KeptGateUp(_kept((E, two_i // 2, H), fmt), _kept((E, two_i // 2, H), fmt))
            return _kept(shape, fmt)
        return make

    return build(cfg, {n: recipe(n, s) for n, s in shapes.items()}, dtype, META)


def run_step(model: CausalLM, step: list[tuple[int, int]]) -> None:
    """One forward of the sequences (tokens before, tokens computed) of a step."""
    seqs, ids, start, page = [], [], 0, 0
    for cell, (ctx, n) in enumerate(step):
        pages = -(-(ctx + n) // BLOCK)
        table = torch.arange(page, page + pages, dtype=torch.int32)
        seqs.append(SeqChunk(start, n, ctx, table, cell))
        ids += [1] * n
        start, page = start + n, page + pages
    state = DeviceState(model.state_spec(BLOCK), page, len(step), META)
    logits = [s.q_start + s.q_len - 1 for s in seqs]
    model(StepBatch.build(seqs, ids, logits, BLOCK, META), state)


def cache_moves(model: CausalLM) -> None:
    """Whole KV pages and state cells copied out of their pools and back (ops.gather_pages,
    scatter_pages, gather_states, scatter_states)."""
    state = DeviceState(model.state_spec(BLOCK), 8, 4, META)
    ids = torch.arange(3, device=META)
    for pool in (state.kv, state.kv_win, state.conv, state.ssm):
        if pool is not None:
            ops.scatter_pages(pool, ids, ops.gather_pages(pool, ids))


def run_all(model: CausalLM) -> None:
    """Every step of STEPS, then the cache's page and cell copies."""
    for step in STEPS.values():
        run_step(model, step)
    cache_moves(model)

"""The engine on CUDA: cached == uncached through every tier, with CUDA graphs and
eagerly, in bf16 and fp32; checkpoints land in pinned host memory; a decode step does
not sync inside the layers (torch.cuda.set_sync_debug_mode("error") around the model).
Skipped without CUDA; tools/gpu_check.sh runs it."""

from __future__ import annotations

import pytest
import torch

from ckptd.model.loader import load_model
from ckptd.model.text.tokenizer import Tokenizer
from tests.daemon.engines import check_cached_equals_uncached, make_engine

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = [list(range(10, 10 + 70)), list(range(10, 10 + 70)) + [5, 6, 7],
           list(range(10, 10 + 40)) + [300, 301], [7] * 9 + list(range(200, 260))]


def _engine(model, tok, path, graphs, **kw):
    eng = make_engine(model, tok, path, block_size=8, interval=32, snapshot_budget=1000.0,
                      **kw)
    if not graphs:
        eng.runner.graphs = None
    return eng


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("graphs", [True, False])
def test_cuda_cached_equals_uncached(tiny_dir, tmp_path, dtype, graphs):
    model = load_model(tiny_dir, dtype, device="cuda")
    tok = Tokenizer.from_dir(tiny_dir)

    def held_pinned(eng):
        held = [v for _, (_, v, _) in eng.cache.store.host.items.items()]
        assert (eng.runner.graphs is not None) == graphs
        assert held and all(t.device.type == "cpu" and t.is_pinned()      # (logits: no)
                            for v in held for n, t in v.items() if n != "logits")
    check_cached_equals_uncached(lambda p, **kw: _engine(model, tok, p, graphs, **kw), tmp_path,
                                 PROMPTS, max_tokens=8, on_warm=held_pinned)


def test_decode_steps_do_not_sync_in_the_layers(tiny_dir):
    from ckptd.model.runner import Runner
    from ckptd.model.sequence import Sequence

    model = load_model(tiny_dir, torch.bfloat16, device="cuda")
    for graphs in (False, True):
        r = Runner(model, num_pages=32, num_cells=4, block_size=16, graphs=graphs)
        seqs = [Sequence(list(range(5, 5 + n))) for n in (30, 9, 17)]
        for i, s in enumerate(seqs):
            r.attach(s)
            s.pages = list(range(i * 8, i * 8 + 4))
        r.step([(s, len(s.tokens)) for s in seqs])
        forward = model.forward

        def strict(batch, state, forward=forward):
            torch.cuda.set_sync_debug_mode("error")
            try:
                return forward(batch, state)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        model.forward = strict
        try:
            for t in range(4):                   # graphs: capture, then replays
                for s in seqs:
                    s.tokens.append(40 + t)
                r.step([(s, 1) for s in seqs])
        finally:
            del model.forward

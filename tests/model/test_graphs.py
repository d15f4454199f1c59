"""Decode steps through a graph's static, padded buffers give the logits and leave the
state of plain eager steps; padded rows never touch a real sequence.

On the CPU the graphs' buffers run eagerly (what a capture records is the same
forward); on CUDA the test captures and replays real CUDA graphs.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # before any triton.jit runs

from ckptd.kernels import dispatch  # noqa: E402
from ckptd.model.loader import load_model  # noqa: E402
from ckptd.model.runner import Runner  # noqa: E402
from ckptd.model.sequence import Sequence  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _tokens(n, seed):
    return torch.randint(0, 500, (n,), generator=torch.Generator().manual_seed(seed),
                         device="cpu").tolist()


def _run(runner: Runner):
    """Five sequences; decodes of 1, 3 (padded to 4), 5 and 2 of them."""
    B = runner.block_size
    seqs = [Sequence(_tokens(n, i)) for i, n in enumerate((30, 7, 18, 41, 3))]
    for i, s in enumerate(seqs):
        runner.attach(s)
        s.pages = list(range(i * 6, i * 6 + -(-(len(s.tokens) + 8) // B)))
    runner.step([(s, len(s.tokens)) for s in seqs])
    out = []
    for t, group in enumerate(([0], [1, 2, 4], [0, 1, 2, 3, 4], [3, 0], [2])):
        for i in group:
            seqs[i].tokens.append(50 + t + i)
        out.append(runner.step([(seqs[i], 1) for i in group]))
    states = [runner.read_pages(s.pages) for s in seqs]
    if runner.state.conv is not None:
        states += [torch.cat([x.flatten() for x in runner.read_recurrent(s.cell)])
                   for s in seqs]
    return out, states


@pytest.mark.parametrize("which", ["hybrid", "llama", "moe", "hybrid-triton"])
def test_graph_decode_equals_eager(which, tiny_hybrid_dir, tiny_llama_dir, tiny_moe_dir,
                                   monkeypatch):
    """hybrid-triton: the kernels a graph records on CUDA, which read the step's device
    tensors (context lengths, page tables, cells) from the refilled buffers."""
    if which.endswith("-triton"):
        monkeypatch.setattr(dispatch, "MODE", "triton")
    path = {"hybrid": tiny_hybrid_dir, "llama": tiny_llama_dir,
            "moe": tiny_moe_dir}[which.removesuffix("-triton")]
    model = load_model(path, device=DEVICE)
    eager = Runner(model, num_pages=40, num_cells=5, block_size=8, graphs=False)
    graphs = Runner(model, num_pages=40, num_cells=5, block_size=8, graphs=True,
                    max_seq_pages=8)
    want, want_state = _run(eager)
    got, got_state = _run(graphs)
    assert sorted(graphs.graphs.graphs) == [1, 2, 4, 5]       # one per bucket used
    assert graphs.graphs.graphs[1].graph is not None or DEVICE == "cpu"
    tol = 1e-5 if DEVICE == "cpu" else 2e-2                  # bf16-free fp32; TF32 on GPU
    for g, w in zip(got, want):
        assert g.device.type == "cpu" and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=0, atol=tol)
    for g, w in zip(got_state, want_state):
        torch.testing.assert_close(g.cpu(), w.cpu(), rtol=0, atol=tol)


def test_too_wide_or_too_many_run_eagerly(tiny_hybrid_dir):
    model = load_model(tiny_hybrid_dir, device=DEVICE)
    r = Runner(model, num_pages=40, num_cells=2, block_size=8, graphs=True, max_seq_pages=2)
    s = Sequence(_tokens(20, 0))                  # 3 pages: wider than the graphs' tables
    r.attach(s)
    s.pages = [0, 1, 2]
    r.step([(s, 20)])
    s.tokens.append(1)
    r.step([(s, 1)])
    assert r.graphs.graphs == {}

"""Every tensor a step needs is made on the model's device, and the layers never wait
for the device: the two properties that make the engine run on a GPU, checked here
on the CPU.

- Under torch.set_default_device("meta") a tensor made without an explicit device
  lands on `meta`, and the first op mixing it with the model's CPU tensors raises: a
  batch of requests through the runner would fail loudly on a forgotten `device=`
  (positions, page tables, cu_seqlens, cells: the rotary bug class).
- On the Triton path (the one CUDA takes; interpreted here) the model's forward makes
  no op that syncs a GPU with the host: no `.item()` / `int()` / `bool()` of a tensor
  (`_local_scalar_dense`), no `.tolist()`, no data-dependent shapes (`nonzero`,
  `bincount`...), no tensor from host data (`lift_fresh`: a blocking copy on CUDA).
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # before any triton.jit runs

from ckptd.kernels import dispatch  # noqa: E402
from ckptd.model.loader import load_model  # noqa: E402
from ckptd.model.runner import Runner  # noqa: E402
from ckptd.model.sequence import Sequence  # noqa: E402
from ckptd.model.testing import Scratch  # noqa: E402
from tests.conftest import HF_ARCHES  # noqa: E402


def _tokens(n, seed):
    return torch.randint(0, 500, (n,), generator=torch.Generator().manual_seed(seed),
                         device="cpu").tolist()


def _steps(runner: Runner) -> list[torch.Tensor]:
    """Three requests: two prefills in one step, a chunk on cached state beside a
    decode, then batched decodes."""
    B = runner.block_size
    seqs = [Sequence(_tokens(n, i)) for i, n in enumerate((40, 13, 21))]
    for i, s in enumerate(seqs):
        runner.attach(s)
        s.pages = list(range(i * 8, i * 8 + -(-(len(s.tokens) + 4) // B)))
    out = [runner.step([(seqs[0], 25), (seqs[1], 13)]),
           runner.step([(seqs[0], 15), (seqs[2], 21)])]
    for t in range(3):
        for s in seqs:
            s.tokens.append(100 + t)
        out.append(runner.step([(s, 1) for s in seqs]))
    return out


def test_meta_default_device_catches_a_tensor_made_without_a_device():
    cpu = torch.ones(3, device="cpu")
    with torch.device("meta"):
        forgot = torch.arange(3)
        with pytest.raises((RuntimeError, NotImplementedError)):
            (cpu + forgot).sum()


MODELS = ["hybrid", "llama", "moe", *HF_ARCHES]
# on the Triton path (interpreted: ~20 s a model): the Mamba2 and the Mamba (v1) kernels
TRITON_MODELS = ["hybrid", "llama", "moe", "nemotron_h", "jamba", "gemma3"]


def _path(which: str, request):
    if which in HF_ARCHES:
        return request.getfixturevalue("hf_dirs")[which]
    return request.getfixturevalue(f"tiny_{which}_dir")


@pytest.mark.parametrize("which", MODELS)
def test_a_batch_of_requests_under_a_meta_default_device(which, request):
    model = load_model(_path(which, request))
    want = _steps(Runner(model, num_pages=32, num_cells=3, block_size=16))
    with torch.device("meta"):
        got = _steps(Runner(model, num_pages=32, num_cells=3, block_size=16))
    for g, w in zip(got, want):
        assert g.device.type == "cpu"
        torch.testing.assert_close(g, w, rtol=0, atol=0)


SYNCS = {"_local_scalar_dense", "nonzero", "masked_select", "bincount", "_unique2",
         "unique_dim", "unique_consecutive", "histc", "equal", "is_nonzero", "lift_fresh",
         "repeat_interleave.Tensor", "allclose", "index_put_.bool"}


class _SyncCounter(TorchDispatchMode):
    """Ops that make a CUDA host wait for the device (or copy host data to it)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__                        # e.g. "nonzero.default"
        if name.split(".")[0] in SYNCS or name in SYNCS:
            self.seen.append(name)
        if name.startswith("index") and any(
                isinstance(a, (list, tuple)) and any(torch.is_tensor(t) and t.dtype == torch.bool
                                                     for t in a) for a in args):
            self.seen.append(f"{name} with a bool mask")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("which", TRITON_MODELS)
def test_the_layers_do_not_sync_with_the_host(which, request, monkeypatch):
    monkeypatch.setattr(dispatch, "MODE", "triton")
    model = load_model(_path(which, request),
                       device="cuda" if torch.cuda.is_available() else "cpu")
    s = Scratch(model, block_size=16, max_tokens=48, n_seqs=2)
    tolist = torch.Tensor.tolist
    calls = []
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: calls.append(1) or tolist(t))
    forward = type(model).forward
    counters = []

    def counted(self, batch, state):
        with _SyncCounter() as c:
            counters.append(c)
            n = len(calls)
            out = forward(self, batch, state)
            c.seen += ["tolist"] * (len(calls) - n)
        return out

    monkeypatch.setattr(type(model), "forward", counted)
    s.feed({0: _tokens(40, 1), 1: _tokens(13, 2)})       # prefills (chunked delta rule)
    s.feed({0: [5], 1: [9]})                             # batched decode
    s.feed({0: _tokens(3, 3), 1: [7]})                   # a chunk beside a decode
    assert len(counters) == 3
    assert [c.seen for c in counters] == [[], [], []]

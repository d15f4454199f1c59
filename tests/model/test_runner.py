"""The runner: chunking, batching, state I/O, fused and packed weights. Pages come from
the cache manager's device tier (with no store), as in the engine."""

from __future__ import annotations

import pytest
import torch

from ckptd.cache.manager import CacheManager
from ckptd.model.arch import layers
from ckptd.model.arch.layers import _FEW_ROWS, MLP, Attention, Matmul, _pack
from ckptd.model.runner import Runner
from ckptd.model.testing import prompt_logits

TOL = 1e-5
B = 16


def _prompt(n, seed):
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _close(a, b):
    return (a - b).abs().max().item() <= TOL


class Pages:
    """A runner with the cache manager that hands out its pages (no store)."""

    def __init__(self, model, num_pages: int, num_cells: int, **kw) -> None:
        self.runner = Runner(model, num_pages, num_cells, B, **kw)
        self.cache = CacheManager(self.runner, self.runner.spec, num_pages, model.fingerprint)

    def add(self, tokens):
        return self.cache.start(tokens)[0]

    def step(self, work):
        self.cache.prepare(work)
        return self.runner.step(work)


def test_random_chunks_and_token_by_token_equal_one_shot(tiny_model):
    tokens = _prompt(70, 7)
    want = prompt_logits(tiny_model, tokens)
    r = Pages(tiny_model, num_pages=12, num_cells=2)
    chunked, stepped = r.add(tokens), r.add(tokens)
    g = torch.Generator().manual_seed(1)
    while chunked.num_computed < len(tokens):
        n = min(int(torch.randint(1, 30, (1,), generator=g)), len(tokens) - chunked.num_computed)
        assert _close(r.step([(chunked, n)])[0], want[chunked.num_computed - 1])
    for i in range(len(tokens)):
        assert _close(r.step([(stepped, 1)])[0], want[i])
    assert chunked.num_computed == stepped.num_computed == 70
    assert len(chunked.pages) == len(stepped.pages) == 5


def test_mixed_step_prefill_chunk_beside_decodes(tiny_model):
    a, b, c = _prompt(37, 1), _prompt(20, 2), _prompt(5, 3)
    r = Pages(tiny_model, num_pages=12, num_cells=3)
    sa, sb, sc = r.add(a), r.add(b), r.add(c)
    first = r.step([(sb, 20), (sc, 5), (sa, 10)])
    sb.tokens.append(7)
    sc.tokens.append(9)
    mixed = r.step([(sb, 1), (sa, 27), (sc, 1)])        # two decodes and a prefill chunk
    sa.tokens.append(4)
    sb.tokens.append(8)
    dec = r.step([(sa, 1), (sb, 1)])
    alone = [prompt_logits(tiny_model, x) for x in (a + [4], b + [7, 8], c + [9])]
    assert _close(first[0], alone[1][19]) and _close(first[1], alone[2][4])
    assert _close(first[2], alone[0][9])
    assert _close(mixed[0], alone[1][20]) and _close(mixed[1], alone[0][36])
    assert _close(mixed[2], alone[2][5])
    assert _close(dec[0], alone[0][37]) and _close(dec[1], alone[1][21])


def test_state_io_round_trips_a_state(tiny_model):
    tokens = _prompt(37, 10) + [42]
    r = Pages(tiny_model, num_pages=10, num_cells=3)
    runner = r.runner
    src = r.add(tokens)
    r.step([(src, 37)])
    full, partial = runner.read_pages(src.pages[:2]), runner.read_partial(src.pages[2], 5)
    assert full.shape == (2, *runner.spec.kv_shape()) and partial.shape[2] == 5

    dst = r.add(tokens)
    r.cache.prepare([(dst, 37)])
    runner.load_pages(dst.pages[:2], full)
    runner.load_partial(dst.pages[2], partial)
    if runner.spec.is_hybrid:
        conv, ssm = runner.read_recurrent(src.cell)
        assert ssm.dtype == torch.float32
        runner.load_recurrent(dst.cell, conv, ssm)
    dst.num_computed = 37
    got = r.step([(src, 1), (dst, 1)])
    assert torch.equal(got[0], got[1])
    assert _close(got[1], prompt_logits(tiny_model, tokens)[-1])

    with pytest.raises(ValueError, match="shape"):
        runner.load_pages(dst.pages[:1], full)
    with pytest.raises(ValueError, match="shape"):
        runner.load_partial(dst.pages[2], partial[:, :1])


@pytest.mark.parametrize("n", [2, 9])
def test_page_views_write_into_the_pages_they_name(tiny_model, n):
    """A restore decodes into these views: few pages one view each, most of the pool
    from one unbind of it; either way each view is its own page's memory."""
    runner = Pages(tiny_model, num_pages=10, num_cells=1).runner
    kv = runner.state.kv
    pages = [7, 1, 4, 9, 0, 3, 8, 2, 6][:n]
    views = runner.page_views(pages)
    assert len(views) == n
    for p, v in zip(pages, views):
        assert v.shape == kv.shape[1:] and v.data_ptr() == kv[p].data_ptr()
        v.fill_(p + 1)
    for p in pages:
        assert torch.equal(kv[p], torch.full_like(kv[p], p + 1))


def test_step_rejects_bad_work(tiny_model):
    r = Pages(tiny_model, num_pages=4, num_cells=2, max_batch_tokens=32)
    seq = r.add(_prompt(40, 11))
    r.cache.prepare([(seq, 32)])
    for work in ([], [(seq, 0)], [(seq, 41)], [(seq, 33)], [(seq, 2), (seq, 2)]):
        with pytest.raises(ValueError):
            r.runner.step(work)
    with pytest.raises(ValueError, match="pages"):       # no pages handed out for them
        r.runner.step([(r.add(_prompt(40, 12)), 20)])
    r.cache.release(seq)
    r.cache.release(seq)                                 # twice is harmless
    with pytest.raises(ValueError, match="cell"):
        r.runner.step([(seq, 1)])
    with pytest.raises(ValueError):
        Runner(tiny_model, num_pages=4, num_cells=1, max_batch_tokens=0)
    with pytest.raises(ValueError, match="vocabulary"):
        r.add([1, 2, tiny_model.config.vocab_size])
    assert r.runner.cells.num_free == 1                  # the second sequence holds one


def test_fused_projections_equal_separate_ones(tiny_model):
    tokens = _prompt(70, 3)
    fused = prompt_logits(tiny_model, tokens)
    mods = [m for m in tiny_model.modules() if isinstance(m, (Attention, MLP))]
    saved = [(m, "qkv" if isinstance(m, Attention) else "gate_up") for m in mods]
    assert mods and all(getattr(m, name) is not None for m, name in saved)  # the loader fused
    attn = next(m for m in mods if isinstance(m, Attention))
    weight = attn.qkv.weight                 # q, k, v weights are views of it: no copy
    q_rows = attn.q_proj.out_features
    assert attn.k_proj.weight.untyped_storage().data_ptr() == \
        weight.untyped_storage().data_ptr()
    assert attn.k_proj.weight.data_ptr() == weight[q_rows:].data_ptr()
    values = [getattr(m, name) for m, name in saved]
    try:
        for m, name in saved:
            setattr(m, name, None)
        separate = prompt_logits(tiny_model, tokens)
    finally:
        for (m, name), v in zip(saved, values):
            setattr(m, name, v)
    assert _close(fused, separate)


needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                  reason="this torch has no oneDNN")


def _matmuls(model):
    return [v for m in model.modules() for v in vars(m).values() if isinstance(v, Matmul)]


@needs_onednn
def test_fp32_cpu_matmuls_pack_large_weights_only():
    assert Matmul(torch.zeros(576, 576)).packed is not None
    assert Matmul(torch.zeros(64, 64)).packed is None            # a oneDNN call costs more
    assert Matmul(torch.zeros(576, 576, dtype=torch.bfloat16)).packed is None


@needs_onednn
def test_fp32_cpu_matmuls_use_packed_weights_for_few_tokens_only(tiny_model, monkeypatch):
    # layers.Matmul: a step of up to _FEW_ROWS tokens multiplies by oneDNN's packed copy
    # of each weight, a longer one by the plain weight; both give the same logits
    monkeypatch.setattr(layers, "_PACK_MIN", 0)        # the tiny model's weights are small
    tiny_model.fuse()
    mms = _matmuls(tiny_model)
    assert len(mms) == 1 + 4 * len(tiny_model.model.layers)   # head; in (qkv), out, gate_up, down
    assert all(m.packed is not None for m in mms)
    few, many = _prompt(70, 7), _prompt(_FEW_ROWS + 40, 8)
    try:
        packed = [prompt_logits(tiny_model, t) for t in (few, many)]
        for m in mms:
            m.packed = None
        plain = [prompt_logits(tiny_model, t) for t in (few, many)]
        for m in mms:                        # packed zeros: only the few-token step sees them
            m.packed = _pack(torch.zeros_like(m.weight))
        zeroed = [prompt_logits(tiny_model, t) for t in (few, many)]
    finally:
        monkeypatch.undo()
        tiny_model.fuse()
    assert all(m.packed is None for m in _matmuls(tiny_model))
    assert _close(packed[0], plain[0]) and torch.equal(packed[1], plain[1])
    assert zeroed[0].abs().max() == 0 and torch.equal(zeroed[1], plain[1])


def test_a_converted_model_fuses_its_converted_weights(tiny_dir):
    from ckptd.model.loader import load_model

    model = load_model(tiny_dir)
    tokens = _prompt(40, 6)
    want = prompt_logits(model, tokens)
    model.to(torch.bfloat16)
    attn = next(m for m in model.modules() if isinstance(m, Attention))
    assert attn.qkv.weight.dtype == torch.bfloat16 and attn.qkv.packed is None
    assert (prompt_logits(model, tokens) - want).abs().max() < 0.5      # bf16 rounding
    model.to(torch.float32)
    assert attn.qkv.weight.dtype == torch.float32 and attn.qkv.weight.is_contiguous()

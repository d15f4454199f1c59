"""The runner and page pool: chunking, batching, page sharing, copy-on-write, hooks."""

from __future__ import annotations

import pytest
import torch

from ckptd.model.arch import layers
from ckptd.model.arch.layers import _FEW_ROWS, MLP, Attention, Matmul, _pack
from ckptd.model.pages import OutOfPages, OutOfSlots, PagePool, SlotPool
from ckptd.model.runner import Runner
from ckptd.model.testing import prompt_logits

TOL = 1e-5
B = 16


def _prompt(n, seed):
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _close(a, b):
    return (a - b).abs().max().item() <= TOL


def test_random_chunks_and_token_by_token_equal_one_shot(tiny_model):
    tokens = _prompt(70, 7)
    want = prompt_logits(tiny_model, tokens)
    runner = Runner(tiny_model, num_pages=12, num_slots=2, block_size=B)
    chunked, stepped = runner.add(tokens), runner.add(tokens)
    g = torch.Generator().manual_seed(1)
    while chunked.num_computed < len(tokens):
        n = min(int(torch.randint(1, 30, (1,), generator=g)), len(tokens) - chunked.num_computed)
        assert _close(runner.step([(chunked, n)])[0], want[chunked.num_computed - 1])
    for i in range(len(tokens)):
        assert _close(runner.step([(stepped, 1)])[0], want[i])
    assert chunked.num_computed == stepped.num_computed == 70
    assert len(chunked.pages) == len(stepped.pages) == 5


def test_mixed_step_prefill_chunk_beside_decodes(tiny_model):
    a, b, c = _prompt(37, 1), _prompt(20, 2), _prompt(5, 3)
    runner = Runner(tiny_model, num_pages=12, num_slots=3, block_size=B)
    sa, sb, sc = runner.add(a), runner.add(b), runner.add(c)
    first = runner.step([(sb, 20), (sc, 5), (sa, 10)])
    sb.tokens.append(7)
    sc.tokens.append(9)
    mixed = runner.step([(sb, 1), (sa, 27), (sc, 1)])   # two decodes and a prefill chunk
    sa.tokens.append(4)
    sb.tokens.append(8)
    dec = runner.step([(sa, 1), (sb, 1)])
    alone = [prompt_logits(tiny_model, x) for x in (a + [4], b + [7, 8], c + [9])]
    assert _close(first[0], alone[1][19]) and _close(first[1], alone[2][4])
    assert _close(first[2], alone[0][9])
    assert _close(mixed[0], alone[1][20]) and _close(mixed[1], alone[0][36])
    assert _close(mixed[2], alone[2][5])
    assert _close(dec[0], alone[0][37]) and _close(dec[1], alone[1][21])


def test_adopted_prefix_pages_match_unshared(tiny_model):
    prefix = _prompt(32, 4)
    suffixes = [_prompt(9, 5), _prompt(21, 6)]
    keys = [b"block-0", b"block-1"]
    runner = Runner(tiny_model, num_pages=10, num_slots=3, block_size=B)
    owner = runner.add(prefix)
    runner.step([(owner, 32)])
    assert runner.publish(owner, keys) == 2
    recurrent = runner.read_recurrent(owner.slot) if runner.spec.is_hybrid else None
    runner.release(owner)
    assert runner.pages.num_cached == 2                    # kept for later prefix hits

    seqs = []
    for suffix in suffixes:
        seq = runner.add(prefix + suffix)
        pages = runner.pages.lookup(keys + [b"block-2"])
        assert len(pages) == 2
        runner.adopt(seq, pages, 32)
        if recurrent is not None:
            runner.load_recurrent(seq.slot, *recurrent)
        seqs.append(seq)
    assert seqs[0].pages == seqs[1].pages
    assert [runner.pages.refs[p] for p in seqs[0].pages] == [3, 3]   # table + 2 sequences
    got = runner.step([(s, len(s.tokens) - 32) for s in seqs])
    for row, suffix in enumerate(suffixes):
        assert _close(got[row], prompt_logits(tiny_model, prefix + suffix)[-1])
    assert seqs[0].pages[:2] == seqs[1].pages[:2]          # full pages still shared
    for s in seqs:
        runner.release(s)
    assert runner.pages.num_cached == 2 and runner.pages.num_free == 8
    assert runner.pages.evict_cached() == 2
    assert runner.pages.refs == [0] * 10 and runner.pages.num_free == 10
    assert runner.slots.num_free == 3


def test_copy_on_write_of_shared_partial_page(tiny_model):
    base = _prompt(20, 8)                                  # page 0 full, page 1 holds 4
    runner = Runner(tiny_model, num_pages=8, num_slots=2, block_size=B)
    parent = runner.add(base + [11, 12, 13])
    runner.step([(parent, 20)])
    child = runner.fork(parent)
    child.tokens[20:] = [21, 22, 23, 24]
    assert child.pages == parent.pages and runner.pages.refs[parent.pages[1]] == 2
    before = runner.read_partial(parent)

    got_child = runner.step([(child, 4)])[0]               # writes into its own copy
    assert child.pages[0] == parent.pages[0] and child.pages[1] != parent.pages[1]
    assert torch.equal(runner.read_partial(parent), before)
    assert runner.pages.refs[parent.pages[1]] == 1
    got_parent = runner.step([(parent, 3)])[0]            # no longer shared: in place
    assert _close(got_child, prompt_logits(tiny_model, base + [21, 22, 23, 24])[-1])
    assert _close(got_parent, prompt_logits(tiny_model, base + [11, 12, 13])[-1])
    runner.release(parent)
    runner.release(child)
    assert runner.pages.refs == [0] * 8


def test_both_sharers_writing_in_one_step(tiny_model):
    base = _prompt(19, 9)
    runner = Runner(tiny_model, num_pages=8, num_slots=2, block_size=B)
    a = runner.add(base + [5])
    runner.step([(a, 19)])
    b = runner.fork(a)
    b.tokens[19] = 6
    got = runner.step([(a, 1), (b, 1)])
    assert _close(got[0], prompt_logits(tiny_model, base + [5])[-1])
    assert _close(got[1], prompt_logits(tiny_model, base + [6])[-1])
    assert len({a.pages[1], b.pages[1]}) == 2
    runner.release(a)
    runner.release(b)
    assert runner.pages.num_free == 8


def test_hooks_round_trip_a_state(tiny_model):
    tokens = _prompt(37, 10) + [42]
    runner = Runner(tiny_model, num_pages=10, num_slots=3, block_size=B)
    src = runner.add(tokens)
    runner.step([(src, 37)])
    full, partial = runner.read_pages(src.pages[:2]), runner.read_partial(src)
    assert full.shape == (2, *runner.spec.kv_shape()) and partial.shape[2] == 5

    dst = runner.add(tokens)
    runner.reserve(dst, 37)
    runner.load_pages(dst.pages[:2], full)
    runner.load_partial(dst, 37, partial)
    if runner.spec.is_hybrid:
        conv, ssm = runner.read_recurrent(src.slot)
        assert ssm.dtype == torch.float32
        runner.load_recurrent(dst.slot, conv, ssm)
    dst.num_computed = 37
    got = runner.step([(src, 1), (dst, 1)])
    assert torch.equal(got[0], got[1])
    assert _close(got[1], prompt_logits(tiny_model, tokens)[-1])

    with pytest.raises(ValueError, match="shape"):
        runner.load_pages(dst.pages[:1], full)
    with pytest.raises(ValueError, match="shape"):
        runner.load_partial(dst, 36, partial)
    other = runner.fork(dst)                               # dst's pages now shared
    with pytest.raises(ValueError, match="holders"):
        runner.load_pages(dst.pages[:2], full)
    runner.release(other)


def test_step_rejects_bad_work(tiny_model):
    runner = Runner(tiny_model, num_pages=4, num_slots=2, block_size=B, max_batch_tokens=32)
    seq = runner.add(_prompt(40, 11))
    for work in ([], [(seq, 0)], [(seq, 41)], [(seq, 33)], [(seq, 2), (seq, 2)]):
        with pytest.raises(ValueError):
            runner.step(work)
    runner.release(seq)
    runner.release(seq)                                    # twice is harmless
    with pytest.raises(ValueError, match="released"):
        runner.step([(seq, 1)])
    with pytest.raises(ValueError):
        Runner(tiny_model, num_pages=4, num_slots=1, max_batch_tokens=0)
    with pytest.raises(ValueError, match="vocabulary"):
        runner.add([1, 2, tiny_model.config.vocab_size])
    assert runner.slots.num_free == 2


def test_out_of_pages_and_slots_change_nothing(tiny_model):
    runner = Runner(tiny_model, num_pages=2, num_slots=1, block_size=B)
    seq = runner.add(_prompt(40, 1))
    assert runner.pages_needed(seq, 40) == 3
    with pytest.raises(OutOfPages):
        runner.step([(seq, 40)])
    assert seq.pages == [] and seq.num_computed == 0 and runner.pages.num_free == 2
    with pytest.raises(OutOfSlots):
        runner.add([1, 2, 3])
    runner.step([(seq, 32)])                               # what fits still runs
    assert runner.pages.num_free == 0


def test_publish_switches_to_an_equal_registered_page(tiny_model):
    tokens = _prompt(16, 12)
    runner = Runner(tiny_model, num_pages=4, num_slots=2, block_size=B)
    a, b = runner.add(tokens + [1]), runner.add(tokens + [2])
    runner.step([(a, 16), (b, 16)])
    assert a.pages != b.pages
    own = b.pages[0]
    runner.publish(a, [b"k0"])
    runner.publish(b, [b"k0"])
    assert b.pages == a.pages and runner.pages.refs[own] == 0
    assert runner.pages.refs[a.pages[0]] == 3


def test_page_pool_lru_reclaim():
    pool = PagePool(4)
    pages = pool.alloc(4)
    for i, p in enumerate(pages):
        assert pool.register(f"k{i}".encode(), p) == p
    pool.decref(pages)                                      # all four cached now
    assert pool.num_free == 0 and pool.num_cached == 4 and pool.num_available == 4
    assert pool.lookup([b"k0", b"k1"]) == pages[:2]         # k2, k3 are now least recent
    got = pool.alloc(2)
    assert sorted(got) == sorted(pages[2:])
    assert pool.lookup([b"k2"]) == [] and pool.lookup([b"k0", b"k1"]) == pages[:2]
    pool.incref([pages[0]])                                 # a sequence holds k0's page
    with pytest.raises(OutOfPages):
        pool.alloc(2)
    assert pool.num_cached == 1 and pool.lookup([b"k1"]) == [pages[1]]   # nothing taken
    assert pool.alloc(1) == [pages[1]]
    with pytest.raises(ValueError):
        PagePool(-1)


def test_page_pool_hands_out_the_lowest_free_ids():
    pool = PagePool(12)
    a, b = pool.alloc(5), pool.alloc(4)
    assert a == [0, 1, 2, 3, 4] and b == [5, 6, 7, 8]
    pool.decref(list(reversed(a)))                      # freed in any order
    pool.decref([6, 8])
    assert pool.alloc(7) == [0, 1, 2, 3, 4, 6, 8]       # consecutive runs, ascending


def test_slot_pool():
    slots = SlotPool(2)
    a, b = slots.alloc(), slots.alloc()
    assert {a, b} == {0, 1} and slots.num_free == 0
    with pytest.raises(OutOfSlots):
        slots.alloc()
    slots.release(a)
    assert slots.alloc() == a
    with pytest.raises(ValueError):
        SlotPool(0)


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

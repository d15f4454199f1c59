"""A sliding-window model's device memory (model/window_pages.py, cache/windows.py): a
tiny Gemma-3-shaped model (16-key windows, 8-token pages) computes a prompt forty
windows long. The window layers' rooms in use stay within the window plus a step's
chunk, and every logit is transformers': while the device lets the window parts go,
when a later prompt restores from pages that kept theirs (the previous answer's end),
from pages that lost them (a prompt parting mid-way: the store has them), and after a
restart from disk."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # before any triton.jit runs

from ckptd.cache.manager import CacheManager  # noqa: E402
from ckptd.cache.store import CacheStore  # noqa: E402
from ckptd.cache.work import Work  # noqa: E402
from ckptd.daemon import memory  # noqa: E402
from ckptd.kernels import dispatch  # noqa: E402
from ckptd.model.loader import load_model  # noqa: E402
from ckptd.model.runner import Runner  # noqa: E402
from ckptd.model.spec import AttentionSpec, StateSpec  # noqa: E402
from ckptd.model.window_pages import WindowRooms  # noqa: E402
from ckptd.tools.make_tiny import make_tiny  # noqa: E402

B, STEP, PAGES = 8, 48, 256
ROOMS = 24       # the window pool, as the daemon sizes it: windows and chunks, twice over


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    folder = make_tiny("gemma3", tmp_path_factory.mktemp("tiny-gemma3-window"))
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return load_model(folder), ref


def _open(model, path, rooms=ROOMS, **store):
    runner = Runner(model, PAGES, 2, B, max_batch_tokens=STEP, window_pages=rooms)
    cache = CacheManager(runner, runner.spec, PAGES, model.fingerprint,
                         CacheStore(path, runner.spec, model.fingerprint, **store), 64)
    return runner, cache


def _compute(runner, cache, tokens, seen=None):
    """Start a sequence on `tokens` and compute them in chunks as the engine does
    (admit, step, after_step): (sequence, its restore's info, logits of every token
    it computed [k, vocab]); `seen` gets the rooms in use after each step."""
    seq, info = cache.start(tokens)
    return seq, info, _steps(runner, cache, [seq], seen)[0]


def _steps(runner, cache, seqs, seen=None, upto=None):
    """Compute the sequences together, a chunk each a step, to their ends (or `upto`
    tokens): each one's logits of every token computed."""
    rows = [[] for _ in seqs]
    while True:
        share = STEP // len(seqs)
        work = [Work(s, cache.chunk(s, min(share, (upto or len(s.tokens)) - s.num_computed)))
                for s in seqs if s.num_computed < (upto or len(s.tokens))]
        if not work:
            return [torch.cat(r) for r in rows]
        cache.admit(work)
        assert all(w.runs for w in work), [w.refused for w in work]
        logits = runner.run([(w.seq, w.n) for w in work], every=frozenset(s.id for s in seqs))
        cache.after_step(work, logits)
        for w in work:
            rows[seqs.index(w.seq)].append(logits.of(w.seq))
        if seen is not None:
            seen.append(runner.state.rooms.in_use)


def _decode(runner, cache, seq, got):
    """One greedy decode step after logits `got`: its logits [1, vocab]."""
    seq.tokens.append(int(got[-1].argmax()))
    w = Work(seq, 1)
    cache.admit([w])
    logits = runner.run([(seq, 1)])
    cache.after_step([w], logits)
    return logits.of(seq)


def _restore_equals(runner, cache, ref, tokens):
    """Start `tokens` from the cache, compute the rest, check its logits against
    transformers', finish it: the restore's info."""
    seq, info, got = _compute(runner, cache, tokens)
    assert (got - _want(ref, tokens)[-got.shape[0]:]).abs().max().item() <= 1e-4
    cache.finish(seq)
    cache.sanity_check()
    return info


def _want(ref, tokens):
    with torch.no_grad():
        return ref(input_ids=torch.tensor([tokens])).logits[0]


def test_window_rooms_stay_bounded_and_every_restore_is_exact(gemma, tmp_path):
    model, ref = gemma
    W = model.config.sliding_window
    assert W == 16
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 500, (40 * W,), generator=g).tolist()
    runner, cache = _open(model, tmp_path)
    rooms = runner.state.rooms
    seen: list[int] = []
    seq, _, got = _compute(runner, cache, prompt, seen)
    want = _want(ref, prompt)
    assert (got - want).abs().max().item() <= 1e-4
    # the window (and a token of slack) and one step's chunk, each rounded out to pages
    bound = -(-(W + 1) // B) + 1 + -(-STEP // B)
    assert rooms.high_water <= bound < len(seq.pages) // 4, (rooms.high_water, len(seq.pages))
    assert max(seen) <= -(-(W + 1) // B) + 1        # between steps: the window alone
    for _ in range(6):                              # decodes: one page at a time
        got = _decode(runner, cache, seq, got)
        assert rooms.in_use <= -(-(W + 1) // B) + 1
    answer = list(seq.tokens)
    assert (got[-1] - _want(ref, answer)[-1]).abs().max().item() <= 1e-4
    cache.finish(seq)
    cache.sanity_check()
    # only the answer's last window keeps its part on the device, for the next turn
    assert 0 < rooms.in_use <= -(-(W + 1) // B) + 1

    # the next turn restores from the device pages whose window part stayed
    turn = answer + [11, 12, 13, 14, 15]
    info = _restore_equals(runner, cache, ref, turn)
    assert info.device_tokens >= len(answer) - B

    # parting mid-way: the device pages there lost their window part; the store has it
    part = prompt[:301] + [21, 22, 23]
    info = _restore_equals(runner, cache, ref, part)
    assert info.cached_tokens >= 296 and info.device_tokens < info.cached_tokens
    cache.close()

    # after a restart, from disk alone
    runner, cache = _open(model, tmp_path, host_budget=0)
    again = answer + [31, 32]
    info = _restore_equals(runner, cache, ref, again)
    assert info.tier == "disk" and info.cached_tokens >= len(answer) - B
    cache.close()


def test_a_window_another_live_sequence_reads_stays(gemma, tmp_path):
    """B restores from A's pages while A is live, at A's position: as A computes on, the
    pages in B's window keep their window part (B reads them next), and both give
    transformers' logits."""
    model, ref = gemma
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(3, 500, (480,), generator=g).tolist()
    runner, cache = _open(model, tmp_path)
    a, _ = cache.start(prompt)
    first = _steps(runner, cache, [a], upto=320)[0]
    b_tokens = prompt[:320] + torch.randint(3, 500, (100,), generator=g).tolist()
    b, info = cache.start(b_tokens)
    assert info.device_tokens == 320
    rest_a, rest_b = _steps(runner, cache, [a, b])
    assert (torch.cat([first, rest_a]) - _want(ref, prompt)).abs().max().item() <= 1e-4
    assert (rest_b - _want(ref, b_tokens)[320:]).abs().max().item() <= 1e-4
    cache.sanity_check()
    cache.finish(a)
    cache.finish(b)
    cache.close()


def test_the_triton_kernels_read_the_rooms_tables(gemma, tmp_path, monkeypatch):
    """The Triton attention and KV writes (interpreted on a CPU: the path CUDA takes)
    through the rooms' tables: a prompt crossing several windows, then decodes, give
    transformers' logits."""
    model, ref = gemma
    monkeypatch.setattr(dispatch, "MODE", "triton")
    prompt = torch.randint(3, 500, (80,), generator=torch.Generator().manual_seed(5)).tolist()
    runner, cache = _open(model, tmp_path)
    seq, _, got = _compute(runner, cache, prompt)
    assert runner.state.rooms.in_use < len(seq.pages) // 2
    assert (got - _want(ref, prompt)).abs().max().item() <= 1e-4
    for _ in range(2):
        got = _decode(runner, cache, seq, got)
    assert (got[-1] - _want(ref, seq.tokens)[-1]).abs().max().item() <= 1e-4
    cache.finish(seq)
    cache.sanity_check()
    cache.close()


def test_a_short_window_pool_takes_back_cached_tails_rooms(gemma, tmp_path):
    """Finished sequences' last windows keep their rooms in the prefix table; when a
    new sequence needs more than are free, those give theirs back (their pages stay
    for the full layers), and the next turn on an early prompt reads its window's part
    from the store: every logit still transformers'."""
    model, ref = gemma
    g = torch.Generator().manual_seed(6)
    runner, cache = _open(model, tmp_path, rooms=12)
    prompts = [torch.randint(3, 500, (100,), generator=g).tolist() for _ in range(5)]
    for p in prompts:
        seq, _, got = _compute(runner, cache, p)
        assert (got - _want(ref, p)).abs().max().item() <= 1e-4
        cache.finish(seq)
    assert runner.state.rooms.high_water == 12
    turn = prompts[0] + [7, 8, 9]
    info = _restore_equals(runner, cache, ref, turn)
    assert info.cached_tokens >= 96 and info.device_tokens < info.cached_tokens
    cache.close()


def test_rooms_are_given_all_or_nothing_lowest_first():
    rooms = WindowRooms(num_pages=6, num_rooms=3)
    assert rooms.keep([4, 2]) and rooms.rooms([4, 2]) == [0, 1]
    assert not rooms.keep([0, 1]) and rooms.has([0, 1, 2]) == [False, False, True]
    rooms.drop([4, 5])                              # a page without one is left alone
    assert rooms.keep([0, 1]) and rooms.rooms([0, 1, 2]) == [0, 2, 1]
    assert rooms.in_use == 3 and rooms.high_water == 3
    assert rooms.rooms([3], missing=0) == [0]
    with pytest.raises(ValueError, match="page 3 holds no window-layer KV"):
        rooms.rooms([3])


def test_the_daemon_sizes_the_window_pool_by_the_windows(gemma):
    """Each running sequence's window and a step's chunk, twice over; the KV budget's
    rest goes to the full layers' pages. A model without windows reserves nothing."""
    model, _ = gemma
    spec = model.state_spec(B)
    rooms = memory.window_rooms(spec, parallel=2, step_tokens=STEP)
    assert rooms == 2 * 2 * (-(-17 // B) + 1 + STEP // B)
    assert spec.window_page_bytes() * 7 == spec.page_bytes() * 6
    reserved = rooms * spec.window_page_bytes()
    full = spec.page_bytes() - spec.window_page_bytes()
    sizes = memory.plan(full, torch.device("cpu"), reserved + 100 * full, 0, 10_000, 2,
                        reserved)
    assert sizes.kv_pages == 100
    plain = StateSpec(B, AttentionSpec(2, 2, 16, torch.float32), None)
    assert memory.window_rooms(plain, 2, STEP) is None and plain.window_page_bytes() == 0

"""The engine's loop in process: batching equals alone, continuous batching, stops,
limits. No store: sequences only get device pages (what `ckptd generate` runs)."""

from __future__ import annotations

import pytest
import torch

from ckptd.cache.manager import CacheManager
from ckptd.daemon.engine import Engine
from ckptd.daemon.request import Finished, Request
from ckptd.model.runner import Runner
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.text.tokenizer import load_tokenizer

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


@pytest.fixture
def tokenizer(tiny_dir):
    return load_tokenizer(tiny_dir)


class RecordingRunner(Runner):
    """A real runner that remembers, per step, which sequences prefilled and decoded."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.prompt_len: dict[int, int] = {}
        self.steps: list[list[str]] = []

    def run(self, work, every=frozenset(), on_device=False):
        for s, _ in work:
            self.prompt_len.setdefault(s.id, len(s.tokens))
        self.steps.append(["decode" if s.num_computed >= self.prompt_len[s.id] else "prefill"
                           for s, _ in work])
        return super().run(work, every, on_device)


def engine(model, tokenizer, num_pages, num_cells, step_tokens=256, runner_class=Runner):
    runner = runner_class(model, num_pages, num_cells, 16, max_batch_tokens=step_tokens)
    cache = CacheManager(runner, runner.spec, num_pages, model.fingerprint)
    return Engine(runner, cache, tokenizer, max_running=num_cells, step_tokens=step_tokens)


def _prompt(n, seed):
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _tokens(events):
    return [e.token for e in events]


def test_batch_decodes_the_same_tokens_as_alone(tiny_model, tokenizer):
    prompts = [_prompt(n, i) for i, n in enumerate((5, 40, 17, 23))]
    eng = engine(tiny_model, tokenizer, num_pages=24, num_cells=4)
    together = eng.generate(prompts, GREEDY)
    alone = [_tokens(eng.stream(p, GREEDY)) for p in prompts]
    assert [_tokens(t) for t in together] == alone
    assert all(len(t) == 10 for t in alone)
    assert eng.cache.device.num_free == 24 and eng.runner.cells.num_free == 4
    eng.cache.sanity_check()


def test_continuous_batching_joins_mixes_and_finishes_independently(tiny_model, tokenizer):
    prompts = [_prompt(n, 10 + i) for i, n in enumerate((6, 30, 21, 3))]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (9, 4, 7, 5)]
    eng = engine(tiny_model, tokenizer, num_pages=24, num_cells=4, step_tokens=20,
                 runner_class=RecordingRunner)
    got = eng.generate(prompts, params, arrivals=[0, 2, 2, 6])
    batched = list(eng.runner.steps)
    alone = [_tokens(eng.stream(p, q)) for p, q in zip(prompts, params)]
    assert [_tokens(t) for t in got] == alone
    assert [len(t) for t in got] == [9, 4, 7, 5]
    assert [t[-1].finish_reason for t in got] == ["length"] * 4
    assert any({"prefill", "decode"} <= set(kinds) for kinds in batched)   # mixed steps
    assert max(len(kinds) for kinds in batched) >= 3
    assert eng.cache.device.num_free == 24
    eng.cache.sanity_check()


def test_seeded_sampling_does_not_depend_on_the_batch(tiny_model, tokenizer):
    mine = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.95, seed=5, ignore_eos=True)
    others = SamplingParams(max_tokens=8, temperature=1.0, seed=9, ignore_eos=True)
    prompt = _prompt(12, 1)
    eng = engine(tiny_model, tokenizer, num_pages=16, num_cells=3)
    alone = _tokens(eng.stream(prompt, mine))
    batch = eng.generate([_prompt(30, 2), prompt, _prompt(7, 3)], [others, mine, others])
    assert _tokens(batch[1]) == alone
    assert alone != _tokens(eng.stream(prompt, SamplingParams(max_tokens=8, temperature=1.0,
                                                              seed=6, ignore_eos=True)))


def test_stop_string_split_across_tokens(tiny_model, tokenizer):
    eng = engine(tiny_model, tokenizer, num_pages=8, num_cells=1)
    prompt = _prompt(10, 2)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    deltas = [e.text for e in eng.stream(prompt, params)]
    full = "".join(deltas)
    # a stop string made of the last character of one token's text and the first of
    # the next one's, at the first place it occurs in the text
    stop = None
    for i in range(len(deltas) - 1):
        cand = deltas[i][-1:] + deltas[i + 1][:1]
        if len(cand) == 2 and full.find(cand) == len("".join(deltas[:i + 1])) - 1:
            stop = cand
            break
    assert stop is not None, f"no token boundary to test in {deltas!r}"
    events = list(eng.stream(prompt, SamplingParams(max_tokens=30, ignore_eos=True,
                                                    stop=(stop, "\x00"))))
    text = "".join(e.text for e in events)
    assert text == full[:full.find(stop)]
    assert events[-1].finish_reason == "stop" and len(events) == i + 2


def test_max_tokens_and_closing_early(tiny_model, tokenizer):
    eng = engine(tiny_model, tokenizer, num_pages=8, num_cells=1)
    events = list(eng.stream(_prompt(10, 2), SamplingParams(max_tokens=7, ignore_eos=True)))
    assert len(events) == 7 and events[-1].finish_reason == "length"
    assert all(e.finish_reason is None for e in events[:-1])
    assert list(eng.stream(_prompt(10, 2), SamplingParams(max_tokens=0))) == []
    stream = eng.stream(_prompt(40, 3), GREEDY)
    next(stream)
    assert eng.cache.device.num_free < 8
    stream.close()                                         # a client that went away
    assert eng.cache.device.num_free == 8 and eng.runner.cells.num_free == 1
    with pytest.raises(ValueError, match="empty"):
        list(eng.stream([], GREEDY))
    with pytest.raises(ValueError, match="arrivals"):
        eng.generate([[1], [2]], GREEDY, arrivals=[0])
    eng.cache.sanity_check()


def test_prefills_that_outgrow_the_pool_take_turns(tiny_model, tokenizer):
    """Two prompts of 7 pages each in a pool of 10: computed side by side they both run
    out; the newer goes back to the queue, and both answer as they do alone."""
    prompts = [_prompt(100, 21), _prompt(100, 22)]
    eng = engine(tiny_model, tokenizer, num_pages=10, num_cells=2, step_tokens=32)
    got = eng.generate(prompts, GREEDY)
    alone = [_tokens(eng.stream(p, GREEDY)) for p in prompts]
    assert [_tokens(t) for t in got] == alone
    assert eng.counters["errors"] == 0
    eng.cache.sanity_check()


def test_a_decode_without_pages_waits_while_a_prefill_goes_on(tiny_model, tokenizer):
    """A decoding sequence whose next token needs a page the pool no longer has waits
    (Stalled) while a prefill that fits its own pages computes: nobody fails, and both
    answer as they do alone once pages come back."""
    eng = engine(tiny_model, tokenizer, num_pages=8, num_cells=2, step_tokens=20)
    prompts = [_prompt(16, 31), _prompt(26, 32)]
    got: list[list[int]] = [[], []]
    ended: list = []
    for i, p in enumerate(prompts):
        eng.submit(Request(list(p), GREEDY, lambda ev, i=i: (
            ended.append(ev) if isinstance(ev, Finished) else got[i].append(ev.token))))
    eng.step()                   # 10 + 10 tokens: A's 16 take two steps, B's 26 three
    eng.step()                   # A's prompt done (one page, 16 of 16), B at 20 of 26
    assert len(got[0]) == 1 and not got[1]
    dev = eng.cache.device
    held = dev.alloc(dev.num_free)         # A's next token needs a page; B's 6 fit in its own
    eng.step()
    assert len(got[0]) == 1 and len(got[1]) == 1 and not ended   # A waited, B went on
    dev.decref(held)
    while len(ended) < 2:
        eng.step()
    assert all(f.reason == "length" for f in ended)
    assert got == [_tokens(eng.stream(p, GREEDY)) for p in prompts]
    eng.cache.sanity_check()

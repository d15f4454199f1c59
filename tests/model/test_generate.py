"""The generation loops: batching equals alone, continuous batching, stops, limits."""

from __future__ import annotations

import pytest
import torch

from ckptd.model.generate import Decoding, StopMatcher, generate, generate_batch
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

    def add(self, tokens):
        seq = super().add(tokens)
        self.prompt_len[seq.id] = len(tokens)
        return seq

    def step(self, work):
        self.steps.append(["decode" if s.num_computed >= self.prompt_len[s.id] else "prefill"
                           for s, _ in work])
        return super().step(work)


def _prompt(n, seed):
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _tokens(events):
    return [e.token for e in events]


def test_batch_decodes_the_same_tokens_as_alone(tiny_model, tokenizer):
    prompts = [_prompt(n, i) for i, n in enumerate((5, 40, 17, 23))]
    runner = Runner(tiny_model, num_pages=24, num_slots=4, block_size=16)
    together = generate_batch(runner, tokenizer, prompts, GREEDY)
    alone = [_tokens(generate(runner, tokenizer, p, GREEDY)) for p in prompts]
    assert [_tokens(t) for t in together] == alone
    assert all(len(t) == 10 for t in alone)
    assert runner.pages.num_free == 24 and runner.slots.num_free == 4


def test_continuous_batching_joins_mixes_and_finishes_independently(tiny_model, tokenizer):
    prompts = [_prompt(n, 10 + i) for i, n in enumerate((6, 30, 21, 3))]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (9, 4, 7, 5)]
    runner = RecordingRunner(tiny_model, num_pages=24, num_slots=4, block_size=16,
                             max_batch_tokens=20)
    got = generate_batch(runner, tokenizer, prompts, params, arrivals=[0, 2, 2, 6],
                         prefill_chunk=8)
    batched = list(runner.steps)
    alone = [_tokens(generate(runner, tokenizer, p, q)) for p, q in zip(prompts, params)]
    assert [_tokens(t) for t in got] == alone
    assert [len(t) for t in got] == [9, 4, 7, 5]
    assert [t[-1].finish_reason for t in got] == ["length"] * 4
    assert any({"prefill", "decode"} <= set(kinds) for kinds in batched)   # mixed steps
    assert max(len(kinds) for kinds in batched) >= 3
    assert runner.pages.num_free == 24


def test_seeded_sampling_does_not_depend_on_the_batch(tiny_model, tokenizer):
    mine = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.95, seed=5, ignore_eos=True)
    others = SamplingParams(max_tokens=8, temperature=1.0, seed=9, ignore_eos=True)
    prompt = _prompt(12, 1)
    runner = Runner(tiny_model, num_pages=16, num_slots=3, block_size=16)
    alone = _tokens(generate(runner, tokenizer, prompt, mine))
    batch = generate_batch(runner, tokenizer, [_prompt(30, 2), prompt, _prompt(7, 3)],
                           [others, mine, others])
    assert _tokens(batch[1]) == alone
    assert alone != _tokens(generate(runner, tokenizer, prompt,
                                     SamplingParams(max_tokens=8, temperature=1.0, seed=6,
                                                    ignore_eos=True)))


def test_stop_string_split_across_tokens(tiny_model, tokenizer):
    runner = Runner(tiny_model, num_pages=8, num_slots=1, block_size=16)
    prompt = _prompt(10, 2)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    deltas = [e.text for e in generate(runner, tokenizer, prompt, params)]
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
    events = list(generate(runner, tokenizer, prompt,
                           SamplingParams(max_tokens=30, ignore_eos=True, stop=(stop, "\x00"))))
    text = "".join(e.text for e in events)
    assert text == full[:full.find(stop)]
    assert events[-1].finish_reason == "stop" and len(events) == i + 2


def test_max_tokens_and_closing_early(tiny_model, tokenizer):
    runner = Runner(tiny_model, num_pages=8, num_slots=1, block_size=16)
    events = list(generate(runner, tokenizer, _prompt(10, 2), SamplingParams(max_tokens=7,
                                                                              ignore_eos=True)))
    assert len(events) == 7 and events[-1].finish_reason == "length"
    assert all(e.finish_reason is None for e in events[:-1])
    assert list(generate(runner, tokenizer, _prompt(10, 2), SamplingParams(max_tokens=0))) == []
    stream = generate(runner, tokenizer, _prompt(40, 3), GREEDY)
    next(stream)
    assert runner.pages.num_free < 8
    stream.close()                                         # a client that went away
    assert runner.pages.num_free == 8 and runner.slots.num_free == 1
    with pytest.raises(ValueError, match="empty"):
        list(generate(runner, tokenizer, [], GREEDY))
    with pytest.raises(ValueError, match="arrivals"):
        generate_batch(runner, tokenizer, [[1], [2]], GREEDY, arrivals=[0])


def test_eos_and_stop_token_ids_end_with_reason_stop(tokenizer):
    eos = min(tokenizer.eos_ids)
    vocab = tokenizer.vocab_size
    at = lambda t: torch.nn.functional.one_hot(torch.tensor(t), vocab).float() * 10
    word = tokenizer.encode("fox")[0]
    dec = Decoding(tokenizer, SamplingParams(max_tokens=5))
    first = dec.accept(at(word))
    assert first.finish_reason is None and first.text
    last = dec.accept(at(eos))
    assert (last.token, last.text, last.finish_reason) == (eos, "", "stop")
    dec = Decoding(tokenizer, SamplingParams(max_tokens=5, ignore_eos=True))
    assert dec.accept(at(eos)).finish_reason is None
    dec = Decoding(tokenizer, SamplingParams(max_tokens=5, stop_token_ids=(word,)))
    assert dec.accept(at(word)).finish_reason == "stop"


def test_stop_matcher():
    m = StopMatcher(("STOP",))
    assert m.feed("abc ST") == ("abc ", False)
    assert m.feed("O") == ("", False)
    assert m.feed("Pxyz") == ("", True)
    m = StopMatcher(("\n\n",))
    assert m.feed("line\n") == ("line", False)
    assert m.feed("more") == ("\nmore", False)
    assert m.feed("\n") == ("", False) and m.flush() == "\n"
    m = StopMatcher(("world", "lo w"))                     # the earliest match wins
    assert m.feed("hello world") == ("hel", True)
    m = StopMatcher(("abc",))
    assert m.feed("xab") == ("x", False)
    assert m.feed("abc") == ("ab", True)                   # "ababc": the stop starts at 2

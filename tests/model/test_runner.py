"""The runner: batching, chunking, page accounting, sampling and stops."""

from __future__ import annotations

import pytest
import torch

from model.generate import StopMatcher, generate, generate_batch
from model.pages import OutOfPages
from model.runner import Runner
from model.sampling import Sampler, SamplingParams
from model.testing import prompt_logits
from model.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_hybrid_dir):
    return Tokenizer.from_dir(tiny_hybrid_dir)


def _prompt(n, seed):
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_batch_decode_equals_alone(tiny_model, tokenizer):
    prompts = [_prompt(n, i) for i, n in enumerate((5, 40, 17, 23))]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    runner = Runner(tiny_model, num_pages=64, num_slots=4, block_size=16)
    together = generate_batch(runner, tokenizer, prompts, params)
    alone = [[e.token for e in generate(runner, tokenizer, p, params)] for p in prompts]
    assert together == alone
    assert runner.pages.num_free == 64                       # everything released


def test_random_chunks_equal_one_shot(tiny_model):
    tokens = _prompt(90, 7)
    want = prompt_logits(tiny_model, tokens)
    runner = Runner(tiny_model, num_pages=16, num_slots=1, block_size=16)
    seq = runner.add(tokens)
    g = torch.Generator().manual_seed(1)
    while seq.num_computed < len(tokens):
        n = min(int(torch.randint(1, 30, (1,), generator=g)), len(tokens) - seq.num_computed)
        got = runner.step([(seq, n)])[0]
        assert (got - want[seq.num_computed - 1]).abs().max() <= 1e-5


def test_out_of_pages_is_an_error_not_a_crash(tiny_model):
    runner = Runner(tiny_model, num_pages=2, num_slots=1, block_size=16)
    seq = runner.add(_prompt(40, 1))
    with pytest.raises(OutOfPages):
        runner.step([(seq, 40)])


def test_sampling_rules():
    logits = torch.tensor([1.0, 3.0, 2.0, 0.5])
    assert Sampler(SamplingParams(temperature=0.0))(logits).token == 1
    assert Sampler(SamplingParams(temperature=5.0, top_k=1))(logits).token == 1
    a = [Sampler(SamplingParams(temperature=1.0, seed=3))(logits).token for _ in range(5)]
    b = [Sampler(SamplingParams(temperature=1.0, seed=3))(logits).token for _ in range(5)]
    assert a == b
    # top_p small: only the most likely token survives
    s = Sampler(SamplingParams(temperature=1.0, top_p=0.1, seed=0))
    assert {s(logits).token for _ in range(20)} == {1}
    out = Sampler(SamplingParams(logprobs=2))(logits)
    assert [t for t, _ in out.top] == [1, 2] and out.logprob == pytest.approx(out.top[0][1])
    for bad in (dict(max_tokens=-1), dict(temperature=-1), dict(top_p=0), dict(logprobs=99)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_stop_string_split_across_tokens():
    m = StopMatcher(("STOP",))
    assert m.feed("abc ST") == ("abc ", False)
    assert m.feed("O") == ("", False)
    assert m.feed("Pxyz") == ("", True)
    m = StopMatcher(("\n\n",))
    assert m.feed("line\n") == ("line", False)
    assert m.feed("more") == ("\nmore", False)


def test_max_tokens_and_stop(tiny_model, tokenizer):
    runner = Runner(tiny_model, num_pages=16, num_slots=1, block_size=16)
    evs = list(generate(runner, tokenizer, _prompt(10, 2),
                        SamplingParams(max_tokens=7, ignore_eos=True)))
    assert len(evs) == 7 and evs[-1].finish_reason == "length"
    text = "".join(e.text for e in evs)
    if len(text) > 3:
        stop = text[2:4]
        evs2 = list(generate(runner, tokenizer, _prompt(10, 2),
                             SamplingParams(max_tokens=7, ignore_eos=True, stop=(stop,))))
        assert evs2[-1].finish_reason == "stop"
        assert stop not in "".join(e.text for e in evs2)

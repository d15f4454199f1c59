"""One sequence's per-token rules: EOS and stop token ids, stop strings."""

from __future__ import annotations

import pytest
import torch

from ckptd.model.sampling.decoding import Decoding, StopMatcher
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.text.tokenizer import load_tokenizer


@pytest.fixture
def tokenizer(tiny_dir):
    return load_tokenizer(tiny_dir)


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

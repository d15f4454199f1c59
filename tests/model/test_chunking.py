"""The property the cache rests on: state carried across chunks equals one shot."""

from __future__ import annotations

import pytest
import torch

from ckptd.model.testing import Scratch, prompt_logits

TOL = 1e-5


def _tokens(n, seed=0, vocab=512):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("cuts", [[16], [7], [1, 40], [33, 34, 64], [63, 64]])
def test_two_or_more_chunks_equal_one_shot(tiny_model, cuts):
    tokens = _tokens(100)
    whole = prompt_logits(tiny_model, tokens)
    s = Scratch(tiny_model, block_size=16, max_tokens=128)
    parts, start = [], 0
    for cut in [*cuts, len(tokens)]:
        parts.append(s.feed({0: tokens[start:cut]}, all_logits=True))
        start = cut
    assert (torch.cat(parts) - whole).abs().max().item() <= TOL


def test_token_by_token_decode_equals_prefill(tiny_model):
    tokens = _tokens(48, seed=3)
    whole = prompt_logits(tiny_model, tokens)
    s = Scratch(tiny_model, block_size=16, max_tokens=64)
    steps = torch.cat([s.feed({0: [t]}) for t in tokens])
    assert (steps - whole).abs().max().item() <= TOL


def test_batched_sequences_equal_alone(tiny_model):
    a, b, c = _tokens(37, 4), _tokens(20, 5), _tokens(5, 6)
    s = Scratch(tiny_model, block_size=16, max_tokens=64, n_seqs=3)
    # one step prefilling all three, then a mixed step, then decode-only steps
    first = s.feed({0: a[:30], 1: b[:20], 2: c[:1]})
    mixed = s.feed({0: a[30:], 1: [7], 2: c[1:]})
    dec = s.feed({0: [9], 1: [8], 2: [3]})
    alone = [prompt_logits(tiny_model, x) for x in (a + [9], b + [7, 8], c + [3])]
    assert (first[1] - alone[1][19]).abs().max() <= TOL
    assert (mixed[0] - alone[0][36]).abs().max() <= TOL
    assert (mixed[1] - alone[1][20]).abs().max() <= TOL
    assert (mixed[2] - alone[2][4]).abs().max() <= TOL
    for i, (want, pos) in enumerate(zip(alone, (37, 21, 5))):
        assert (dec[i] - want[pos]).abs().max() <= TOL

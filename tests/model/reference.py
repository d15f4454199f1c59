"""Our models against transformers' on the same checkpoint: prompt logits at several
lengths, and greedy decoding one token a step."""

from __future__ import annotations

import torch

from ckptd.model.testing import Scratch, prompt_logits


def check_prompt_logits(ref, ours, lengths=(1, 17, 300), tol: float = 1e-4) -> list[int]:
    """Random prompts of each length: our logits within tol of transformers'. Returns
    the last prompt, after checking the model is not degenerate on it."""
    g = torch.Generator().manual_seed(1)
    for n in lengths:
        tokens = torch.randint(3, 512, (n,), generator=g).tolist()
        with torch.no_grad():
            want = ref(input_ids=torch.tensor([tokens])).logits[0]
        got = prompt_logits(ours, tokens)
        assert got.shape == want.shape
        assert (got - want).abs().max().item() <= tol, n
    # the greedy pick varies along the long prompt
    assert len(set(want.argmax(-1).tolist())) > 20
    return tokens


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens: the prompt in one step, then one decode step per token; end of
    sequence never picked (as transformers' min_new_tokens does)."""
    s = Scratch(model, max_tokens=len(prompt) + n + 16)
    eos = list(model.config.eos_token_ids)

    def pick(logits: torch.Tensor) -> int:
        logits = logits.clone()
        logits[eos] = float("-inf")
        return int(logits.argmax())
    out = [pick(s.feed({0: prompt})[-1])]
    while len(out) < n:
        out.append(pick(s.feed({0: [out[-1]]})[-1]))
    return out


def check_greedy(ref, ours, prompt: list[int], n: int = 24) -> None:
    """n greedy tokens after prompt, decoded a step at a time: transformers' own."""
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                            min_new_tokens=n)[0, len(prompt):].tolist()
    assert greedy(ours, prompt, n) == want

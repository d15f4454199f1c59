"""Logit bias and repetition penalties: a logits row adjusted before a token is chosen.

Order and formulas are llama.cpp's (and transformers'/vLLM's): the bias is added,
then a token the penalties count has its logit divided by `repetition_penalty` when
positive (multiplied when not), then `count * frequency_penalty + presence_penalty`
is taken off. What is counted follows the API the request came through:

- OpenAI / vLLM (`penalty_last_n` None): presence and frequency count the tokens
  generated so far; the repetition penalty hits every token of the prompt or the
  output.
- llama.cpp (`penalty_last_n` n): all three count the last n tokens of prompt and
  output together (0: no penalties; -1: all of them).

Logprobs stay those of the model's own distribution (Sampler), as both APIs report.
"""

from __future__ import annotations

from collections import deque

import torch


class Penalties:
    """One request's adjustments; `adjust(logits)` then `seen(token)` per token."""

    def __init__(self, params, prompt: list[int] = ()) -> None:
        self.p = params
        self.window = params.penalty_last_n
        self.penalize = (params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
                         or params.repetition_penalty != 1.0) and self.window != 0
        self.active = self.penalize or bool(params.logit_bias)
        # OpenAI's presence/frequency count only the output: the prompt is read for
        # llama.cpp's window or a repetition penalty, else not at all
        reads_prompt = self.window is not None or params.repetition_penalty != 1.0
        self.prompt = prompt if self.penalize and reads_prompt else ()
        self.counts: torch.Tensor | None = None     # [vocab] int32: the counted tokens
        self.repeated: torch.Tensor | None = None   # [vocab] bool: what the repetition hits
        self.recent: deque[int] = deque()           # llama.cpp's window, oldest first
        self.bias: tuple[torch.Tensor, torch.Tensor] | None = None   # (ids, values)

    def _start(self, vocab: int) -> None:
        ids = torch.tensor(self.prompt, dtype=torch.long)
        ids = ids[(ids >= 0) & (ids < vocab)]
        if self.window is None:
            self.counts = torch.zeros(vocab, dtype=torch.int32)
            if self.p.repetition_penalty != 1.0:
                self.repeated = torch.bincount(ids, minlength=vocab) > 0
        else:
            if self.window > 0:
                ids = ids[-self.window:]
                self.recent.extend(ids.tolist())
            self.counts = torch.bincount(ids, minlength=vocab).to(torch.int32)
        self.prompt = ()

    def adjust(self, logits: torch.Tensor) -> torch.Tensor:
        """A new fp32 row [vocab] (the input itself when nothing applies)."""
        if not self.active:
            return logits
        out = logits.float().clone()
        if self.bias is None:                # built at the first token, when vocab is known
            pairs = [(i, b) for i, b in self.p.logit_bias if i < out.numel()]
            self.bias = (torch.tensor([i for i, _ in pairs], dtype=torch.long),
                         torch.tensor([b for _, b in pairs], dtype=out.dtype))
        if self.bias[0].numel():
            out[self.bias[0]] += self.bias[1]
        if not self.penalize:
            return out
        if self.counts is None:
            self._start(out.numel())
        p = self.p
        if p.repetition_penalty != 1.0:
            hit = self.counts > 0 if self.repeated is None else self.repeated
            scaled = torch.where(out > 0, out / p.repetition_penalty, out * p.repetition_penalty)
            out = torch.where(hit, scaled, out)
        if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            c = self.counts.float()
            out -= c * p.frequency_penalty + (c > 0).float() * p.presence_penalty
        return out

    def seen(self, token: int) -> None:
        """Count a chosen token."""
        if not self.penalize or self.counts is None or not 0 <= token < self.counts.numel():
            return
        self.counts[token] += 1
        if self.repeated is not None:
            self.repeated[token] = True
        if self.window is not None and self.window > 0:
            self.recent.append(token)
            if len(self.recent) > self.window:
                self.counts[self.recent.popleft()] -= 1

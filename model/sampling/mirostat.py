"""Mirostat sampling (arXiv 2007.14966), as llama.cpp defines it (src/llama-sampler.cpp):
it steers the surprise (-log2 p) of the drawn tokens toward a target tau, keeping a
running threshold mu (2 * tau at the start) that each drawn token moves by
eta * (its surprise - tau).

- version 2 keeps the most likely tokens whose surprise is at most mu (at least one);
- version 1 estimates the distribution's Zipf exponent s from its top m tokens and
  keeps the top k that mu implies.

Either way the surprise of the drawn token is measured in the kept, renormalised
distribution. With mirostat on, llama.cpp runs temperature then mirostat and none of
the other filters; so does ckptd.
"""

from __future__ import annotations

import math

import torch

TOP_M = 100          # llama.cpp's m: the tokens version 1 estimates s from


class Mirostat:
    """One request's state: mu moves with every token drawn."""

    def __init__(self, version: int, tau: float, eta: float) -> None:
        if version not in (1, 2):
            raise ValueError(f"mirostat must be 0, 1 or 2, got {version}")
        self.version, self.tau, self.eta = version, tau, eta
        self.mu = 2.0 * tau

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        """The kept distribution for logits x [vocab] (temperature applied): [vocab],
        sums to 1, zero outside the kept tokens."""
        probs, order = x.softmax(-1).sort(descending=True)
        if self.version == 2:
            # surprise rises down the sorted list: keep up to the first above mu
            keep = int((-probs.log2() <= self.mu).sum())
        else:
            keep = self._top_k(probs, x.numel())
        keep = max(keep, 1)
        out = torch.zeros_like(probs)
        out[order[:keep]] = probs[:keep] / probs[:keep].sum()
        return out

    def _top_k(self, probs: torch.Tensor, n_vocab: int) -> int:
        m = min(TOP_M - 1, probs.numel() - 1)
        top = probs[:m + 1].double()
        if m < 1 or float(top[m]) <= 0.0:
            return int((probs > 0).sum())
        i = torch.arange(m, dtype=torch.float64)
        t = torch.log((i + 2) / (i + 1))
        b = torch.log(top[:-1] / top[1:])
        s_hat = float((t * b).sum() / (t * t).sum())
        eps = s_hat - 1.0
        try:
            k = (eps * 2.0 ** self.mu / (1.0 - n_vocab ** -eps)) ** (1.0 / s_hat)
        except (OverflowError, ZeroDivisionError):
            return n_vocab
        return n_vocab if not math.isfinite(k) or k > n_vocab else int(k)

    def observe(self, p: float) -> None:
        """The drawn token's probability in the kept distribution: mu follows it."""
        surprise = -math.log2(p) if p > 0.0 else 64.0
        self.mu -= self.eta * (surprise - self.tau)

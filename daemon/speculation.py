"""Speculative decoding in the engine's step: a draft model proposes a few tokens for
each decoding sequence, the model computes them all in the step (the packed
multi-token step a prefill chunk uses) and its sampler, run over their logits one
position after another, keeps the drafted tokens it would have drawn itself. The
answer is the one decoding without a draft gives: the same sampler, seeded the same,
sees the same logits in the same order; it only sees several of them a step.

    drafts = spec.propose(batch)     before cache.admit: drafted tokens join the step
    spec.ready(drafts, cache)        after it: those with pages are marked (runner.mark)
    spec.verify(drafts, rows)        after runner.step: sample, take back what was not
                                     kept (runner.rewind), before cache.after_step

What a sequence did not keep never reaches the cache: the sequence is back at its last
kept token before after_step publishes pages or finish takes its checkpoint.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from ckptd.cache.device import OutOfPages
from ckptd.cache.manager import CacheManager
from ckptd.cache.work import Work
from ckptd.daemon.request import Live
from ckptd.daemon.scheduler import Batch
from ckptd.model.runner import Mark, Runner
from ckptd.model.sampling.decoding import TokenEvent
from ckptd.model.speculative.drafter import Drafter
from ckptd.model.speculative.params import DEFAULT_LIMITS, DraftLimits


@dataclass(frozen=True)
class SpecConfig:
    limits: DraftLimits = DEFAULT_LIMITS
    # llama.cpp's synthetic acceptance (benchmarking only: the output is not the model's):
    # P(keep drafted token i | the ones before kept), drawn from a seeded stream
    synth: tuple[float, ...] = ()


@dataclass(eq=False)
class Draft:
    """One sequence's drafted tokens in this step."""
    live: Live
    work: Work
    tokens: list[int]
    base: int                      # the sequence's tokens before them
    mark: Mark | None = None


class Speculation:
    def __init__(self, drafter: Drafter, runner: Runner, cfg: SpecConfig,
                 eog: frozenset[int]) -> None:
        self.drafter, self.runner, self.cfg, self.eog = drafter, runner, cfg, eog
        self.rngs: dict[int, random.Random] = {}    # synthetic acceptance, per sequence
        self.stalled: set[int] = set()      # no pages for a draft last step: none this one

    def propose(self, batch: Batch) -> list[Draft]:
        """Draft for the batch's decoding sequences; each one's drafted tokens are
        appended to its tokens and its work's budget grows by them."""
        asks, whose = [], []
        for live, w in zip(batch.lives, batch.work):
            seq = live.seq
            if not live.t_decode or w.error is not None or seq.id in self.stalled:
                self.stalled.discard(seq.id)
                continue
            p = live.req.params
            lim = self.cfg.limits if p.draft is None else p.draft.over(self.cfg.limits)
            # the model's token after the draft's counts too: never past max_tokens
            n_max = min(lim.n_max, p.max_tokens - live.dec.n - 1)
            if n_max <= 0 or n_max < lim.n_min:
                continue
            asks.append((seq.id, seq.tokens, replace(lim, n_max=n_max)))
            whose.append((live, w))
        out = []
        for (live, w), tokens in zip(whose, self.drafter.propose(asks) if asks else []):
            # ids only the draft has (its vocabulary may be padded longer) end the draft
            tokens = tokens[:next((i for i, t in enumerate(tokens)
                                   if t >= self.runner.vocab_size), len(tokens))]
            if tokens:
                out.append(Draft(live, w, tokens, len(live.seq.tokens)))
                live.seq.tokens += tokens
                w.budget = 1 + len(tokens)
        return out

    def ready(self, drafts: list[Draft], cache: CacheManager) -> list[Draft]:
        """After admission: the drafts whose sequences got pages for all their tokens,
        marked; the others' drafted tokens are dropped, and the sequence decodes its one
        token as it would have without a draft, when there are pages for that."""
        kept = []
        for d in drafts:
            seq, w = d.live.seq, d.work
            if w.n == 1 + len(d.tokens):
                d.mark = self.runner.mark(seq)
                kept.append(d)
                continue
            del seq.tokens[d.base:]
            self.drafter.release(seq.id)
            self.stalled.add(seq.id)
            if w.stalled:
                try:
                    cache.prepare([(seq, 1)])
                    w.n, w.stalled, w.budget = 1, False, 1
                except OutOfPages:
                    pass
        return kept

    def verify(self, drafts: list[Draft], rows: dict[int, torch.Tensor]
               ) -> dict[int, list[TokenEvent]]:
        """Sample each drafted sequence over its step's logits, position by position, as
        long as the sampler draws the drafted token; the sequence goes back to its last
        kept token. Returns each one's events (the tokens it gained, in order): all but
        the last are in the sequence's tokens (computed), the last is not appended yet
        (the engine does that, as after a plain step)."""
        out = {}
        for d in drafts:
            seq, dec, st = d.live.seq, d.live.dec, d.live.req.stats
            logits, k = rows[seq.id], len(d.tokens)
            events: list[TokenEvent] = []
            hits = 0
            for i in range(k + 1):
                forced = self._synthetic(d, i) if self.cfg.synth and i < k else None
                ev = dec.accept(logits[i], forced)
                events.append(ev)
                hit = i < k and (forced is not None if self.cfg.synth
                                 else ev.token == d.tokens[i])
                hits += hit
                if ev.finish_reason is not None or not hit:
                    break
            e = len(events)         # the state keeps the last token and e - 1 drafted ones
            del seq.tokens[d.base + e - 1:]
            self.runner.rewind(seq, d.mark, d.base + e - 1)
            self.drafter.settle(seq.id, e - 1)
            st.draft_n += k
            st.draft_n_accepted += hits
            out[seq.id] = events
        return out

    def release(self, seq_id: int) -> None:
        self.drafter.release(seq_id)
        self.rngs.pop(seq_id, None)
        self.stalled.discard(seq_id)

    def _synthetic(self, d: Draft, i: int) -> int | None:
        """llama.cpp's synthetic acceptance: the drafted token at i is kept with its
        probability (never an end-of-generation token), from a stream seeded by the
        request's seed."""
        rng = self.rngs.get(d.live.seq.id)
        if rng is None:
            seed = d.live.req.params.seed
            rng = self.rngs[d.live.seq.id] = random.Random(seed)
        keep = rng.random() < self.cfg.synth[i]
        return d.tokens[i] if keep and d.tokens[i] not in self.eog else None

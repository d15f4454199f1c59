"""Speculative decoding in the engine's step: a draft model proposes a few tokens for
each decoding sequence, the model computes them all in the step (the packed
multi-token step a prefill chunk uses) and its sampler, run over their logits one
position after another, keeps the drafted tokens it would have drawn itself. The
answer is the one decoding without a draft gives: the same sampler, seeded the same,
sees the same logits in the same order; it only sees several of them a step.

It enters the loop at one point, the scheduler's (its Drafting hook), and rides on
the decoding sequence's Work from there:

    scheduler.schedule()     spec.propose: drafted tokens join their sequence, with
                             pages for them (else none this time), marked (runner.mark),
                             and each Work carries its Draft (cache/work.py)
    cache.admit, runner.run  the drafted tokens are computed with the sequence's own;
    cache.after_step         the cache publishes nothing a draft leaves in doubt
    postprocess              the work's outcome is its Draft verified (Verified):
                             sampled over the rows, what was not kept taken back
                             (runner.rewind)

Nothing else: `propose` is given every decoding sequence each step, and what it keeps
for one no longer among them (it ended: a sequence decodes until it ends) goes back
there, the draft model's pages and cell included (`unload` lets all go when the
daemon sleeps). What a sequence did not keep never reaches the cache: the sequence
is back at its last kept token before a page of it is published or finish takes its
checkpoint.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from ckptd.cache.device import OutOfPages
from ckptd.cache.manager import CacheManager
from ckptd.daemon.request import Live
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
    """One sequence's drafted tokens in this step (cache/work.py's Draft)."""
    live: Live
    tokens: list[int]
    base: int                      # the sequence's tokens before them
    mark: Mark
    spec: Speculation              # who drafted them: it verifies them

    def verify(self, logits: torch.Tensor) -> list[TokenEvent]:
        return self.spec.verify(self, logits)


class Speculation:
    def __init__(self, drafter: Drafter, runner: Runner, cfg: SpecConfig,
                 eog: frozenset[int]) -> None:
        self.drafter, self.runner, self.cfg, self.eog = drafter, runner, cfg, eog
        self.rngs: dict[int, random.Random] = {}    # synthetic acceptance, per sequence
        self.stalled: set[int] = set()      # no pages for a draft last step: none this one
        self.drafts: dict[int, Draft] = {}  # this step's, by sequence id, until verified
        self.decoding: set[int] = set()     # the ids propose was given last

    def propose(self, decoding: list[Live], cache: CacheManager) -> dict[int, Draft]:
        """Draft for the decoding sequences (every one, each step): each one's drafted
        tokens are appended to its tokens, with pages for them and its state marked, or
        dropped when the pages are not there (it then decodes its one token as without a
        draft). What was kept for a sequence that decoded last step and is not here now
        (it ended) goes back first. Returns the drafts, by sequence id."""
        ids = {live.seq.id for live in decoding}
        for gone in self.decoding - ids:
            self._forget(gone)
        self.decoding = ids
        asks, whose, drafted = [], [], {}
        for live in decoding:
            seq = live.seq
            if seq.id in self.stalled:
                self.stalled.discard(seq.id)
                continue
            p = live.req.params
            lim = self.cfg.limits if p.draft is None else p.draft.over(self.cfg.limits)
            # the model's token after the draft's counts too: never past max_tokens
            n_max = min(lim.n_max, p.max_tokens - live.dec.n - 1)
            if n_max <= 0 or n_max < lim.n_min:
                continue
            asks.append((seq.id, seq.tokens, replace(lim, n_max=n_max)))
            whose.append(live)
        for live, tokens in zip(whose, self.drafter.propose(asks) if asks else []):
            # ids only the draft has (its vocabulary may be padded longer) end the draft
            tokens = tokens[:next((i for i, t in enumerate(tokens)
                                   if t >= self.runner.vocab_size), len(tokens))]
            d = self._take(live, tokens, cache) if tokens else None
            if d is not None:
                drafted[live.seq.id] = d
        return drafted

    def _take(self, live: Live, tokens: list[int], cache: CacheManager) -> Draft | None:
        """Append a draft to its sequence, with the pages for it; None (nothing
        appended) when there are none."""
        seq = live.seq
        base = len(seq.tokens)
        seq.tokens += tokens
        try:
            cache.prepare([(seq, 1 + len(tokens))])
        except OutOfPages:
            del seq.tokens[base:]
            self.drafter.release(seq.id)
            self.stalled.add(seq.id)
            return None
        d = self.drafts[seq.id] = Draft(live, tokens, base, self.runner.mark(seq), self)
        return d

    def verify(self, d: Draft, logits: torch.Tensor) -> list[TokenEvent]:
        """Sample a drafted sequence over its step's logits [1 + drafted, vocab], position
        by position, as long as the sampler draws the drafted token; the sequence goes
        back to its last kept token. Returns the tokens it gained, in order: all but the
        last are in the sequence's tokens (computed), the last is not appended yet (the
        engine does that, as after a plain step)."""
        del self.drafts[d.live.seq.id]
        live = d.live
        seq, dec, st = live.seq, live.dec, live.req.stats
        k = len(d.tokens)
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
        self.drafter.keep(seq.id, e - 1)
        st.draft_n += k
        st.draft_n_accepted += hits
        return events

    def _forget(self, seq_id: int) -> None:
        """An ended sequence: its draft sequence's pages and cell go back, its state here."""
        self.drafter.release(seq_id)
        self.rngs.pop(seq_id, None)
        self.stalled.discard(seq_id)
        self.drafts.pop(seq_id, None)

    def unload(self) -> None:
        """The daemon sleeps (no sequence is live): what was kept for the last decoding
        sequences goes, then the draft model (Runner.release)."""
        for seq_id in self.decoding:
            self._forget(seq_id)
        self.decoding = set()
        self.drafter.runner.release()

    def reload(self, draft) -> None:
        """Waking up: the draft model again."""
        self.drafter.runner.reload(draft)

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

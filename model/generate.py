"""The plain generation loop: one or more sequences, greedy or sampled, with stops.

`generate` streams one prompt; `generate_batch` is continuous batching in
miniature: prompts join at given iterations, are prefilled in chunks next to
other sequences' decodes, and finish independently, one runner.step per
iteration. The daemon's scheduler reuses `Decoding` for the per-token rules.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ckptd.model.runner import Runner, Sequence
from ckptd.model.sampling.sampler import Sampled, Sampler, SamplingParams
from ckptd.model.text.tokenizer import StreamDecoder, Tokenizer


@dataclass
class TokenEvent:
    token: int
    text: str                      # text delta (never a partial character or stop string)
    sampled: Sampled
    finish_reason: str | None = None   # "stop" (EOS, stop token or string) or "length"


class StopMatcher:
    """Holds back text that might be the start of a stop string; cuts at the first match."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to emit, stopped)."""
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[:min(hits)], ""
            return out, True
        # the longest tail that could still grow into a stop string stays pending
        hold = max((k for s in self.stops for k in range(1, len(s))
                    if self.pending.endswith(s[:k])), default=0)
        out = self.pending[:len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class Decoding:
    """One sequence's sampling state: sampler, detokenizer, stop rules, token count."""

    def __init__(self, tokenizer: Tokenizer, params: SamplingParams,
                 prompt: list[int] = ()) -> None:
        self.params = params
        self.sampler = Sampler(params, prompt)   # the prompt, for repetition penalties
        self.detok = StreamDecoder(tokenizer)
        self.stops = StopMatcher(params.stop)
        eos = set() if params.ignore_eos else set(tokenizer.eos_ids)
        self.stop_ids = eos | set(params.stop_token_ids)
        self.n = 0
        self.finished = False

    def accept(self, logits) -> TokenEvent:
        """Sample the next token from logits [vocab] and apply the stop rules."""
        assert not self.finished, "accept after the sequence finished"
        s = self.sampler(logits)
        self.n += 1
        if s.token in self.stop_ids:
            return self._end(TokenEvent(s.token, self.stops.flush(), s, "stop"))
        text, stopped = self.stops.feed(self.detok.push(s.token))
        if stopped:
            return self._end(TokenEvent(s.token, text, s, "stop"))
        if self.n >= self.params.max_tokens:
            return self._end(TokenEvent(s.token, text + self.stops.flush(), s, "length"))
        return TokenEvent(s.token, text, s)

    def _end(self, ev: TokenEvent) -> TokenEvent:
        self.finished = True
        return ev


def generate(runner: Runner, tokenizer: Tokenizer, prompt: list[int], params: SamplingParams,
             prefill_chunk: int | None = None) -> Iterator[TokenEvent]:
    """Prefill `prompt` in chunks, then decode until a stop; yields one event per token."""
    for _, ev in _run(runner, tokenizer, [prompt], [params], [0], prefill_chunk):
        yield ev


def generate_batch(runner: Runner, tokenizer: Tokenizer, prompts: list[list[int]],
                   params: SamplingParams | list[SamplingParams],
                   arrivals: list[int] | None = None,
                   prefill_chunk: int | None = None) -> list[list[TokenEvent]]:
    """Generate for several prompts together, one runner.step per iteration.

    Prompt i joins at iteration arrivals[i] (default: all at 0). Each step decodes
    every sequence that is generating and spends the rest of the runner's token
    budget on prefill chunks of at most prefill_chunk tokens. Returns each prompt's
    events.
    """
    n = len(prompts)
    plist = [params] * n if isinstance(params, SamplingParams) else list(params)
    arrivals = [0] * n if arrivals is None else list(arrivals)
    if len(plist) != n or len(arrivals) != n:
        raise ValueError(f"{n} prompts need as many params and arrivals, got "
                         f"{len(plist)} and {len(arrivals)}")
    if any(a < 0 for a in arrivals):
        raise ValueError("arrivals must be >= 0")
    events: list[list[TokenEvent]] = [[] for _ in prompts]
    for i, ev in _run(runner, tokenizer, prompts, plist, arrivals, prefill_chunk):
        events[i].append(ev)
    return events


def _run(runner: Runner, tokenizer: Tokenizer, prompts: list[list[int]],
         params: list[SamplingParams], arrivals: list[int],
         prefill_chunk: int | None) -> Iterator[tuple[int, TokenEvent]]:
    """Yields (prompt index, event) as tokens are generated."""
    if any(not p for p in prompts):
        raise ValueError("prompt is empty")
    chunk = prefill_chunk or runner.max_batch_tokens
    if chunk <= 0:
        raise ValueError(f"prefill_chunk must be positive, got {chunk}")
    waiting = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    live: list[tuple[int, Sequence, Decoding]] = []
    it = 0
    try:
        while waiting or live:
            while waiting and arrivals[waiting[0]] <= it:
                i = waiting.pop(0)
                if params[i].max_tokens > 0:
                    live.append((i, runner.add(prompts[i]),
                                 Decoding(tokenizer, params[i], prompts[i])))
            if not live:
                if waiting:
                    it = arrivals[waiting[0]]
                continue
            # decodes first (one token left to compute), so a prefill never stalls a stream
            ordered = sorted(live, key=lambda x: len(x[1].tokens) - x[1].num_computed > 1)
            work, rows, budget = [], [], runner.max_batch_tokens
            for entry in ordered:
                seq = entry[1]
                k = min(len(seq.tokens) - seq.num_computed, chunk, budget)
                if k > 0:
                    work.append((seq, k))
                    rows.append(entry)
                    budget -= k
            logits = runner.step(work)
            for row, (i, seq, dec) in enumerate(rows):
                if seq.num_computed < len(seq.tokens):
                    continue                           # mid-prompt: no token yet
                ev = dec.accept(logits[row])
                if ev.finish_reason:
                    runner.release(seq)
                    live = [x for x in live if x[1] is not seq]
                else:
                    seq.tokens.append(ev.token)
                yield i, ev
            it += 1
    finally:
        for _, seq, _ in live:
            runner.release(seq)

"""The plain generation loop: one or more sequences, greedy or sampled, with stops."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from model.runner import Runner, Sequence
from model.sampling import Sampled, Sampler, SamplingParams
from model.tokenizer import StreamDecoder, Tokenizer


@dataclass
class TokenEvent:
    token: int
    text: str                      # text delta (never a partial character or stop string)
    sampled: Sampled
    finish_reason: str | None = None


class StopMatcher:
    """Holds back text that might be the start of a stop string; cuts at a full match."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to emit, stopped)."""
        self.pending += text
        for s in self.stops:
            i = self.pending.find(s)
            if i >= 0:
                out, self.pending = self.pending[:i], ""
                return out, True
        hold = max((k for s in self.stops for k in range(1, len(s))
                    if self.pending.endswith(s[:k])), default=0)
        out = self.pending[:len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class Decoding:
    """One sequence's sampling state: sampler, detokenizer, stop rules."""

    def __init__(self, tokenizer: Tokenizer, params: SamplingParams) -> None:
        self.params = params
        self.sampler = Sampler(params)
        self.detok = StreamDecoder(tokenizer)
        self.stops = StopMatcher(params.stop)
        self.eos = set() if params.ignore_eos else set(tokenizer.eos_ids)
        self.eos |= set(params.stop_token_ids)
        self.n = 0

    def accept(self, logits) -> TokenEvent:
        s = self.sampler(logits)
        self.n += 1
        if s.token in self.eos:
            return TokenEvent(s.token, self.stops.flush(), s, "stop")
        text, stopped = self.stops.feed(self.detok.push(s.token))
        if stopped:
            return TokenEvent(s.token, text, s, "stop")
        if self.n >= self.params.max_tokens:
            return TokenEvent(s.token, text + self.stops.flush(), s, "length")
        return TokenEvent(s.token, text, s)


def generate(runner: Runner, tokenizer: Tokenizer, prompt: list[int], params: SamplingParams,
             chunk: int = 512) -> Iterator[TokenEvent]:
    """Prefill `prompt` in chunks, then decode until a stop; yields one event per token."""
    if not prompt:
        raise ValueError("prompt is empty")
    if params.max_tokens == 0:
        return
    seq = runner.add(prompt)
    try:
        dec = Decoding(tokenizer, params)
        while True:
            n = min(chunk, len(seq.tokens) - seq.num_computed)
            logits = runner.step([(seq, n)])[0]
            if seq.num_computed < len(seq.tokens):
                continue
            ev = dec.accept(logits)
            yield ev
            if ev.finish_reason:
                return
            seq.tokens.append(ev.token)
    finally:
        runner.release(seq)


def generate_batch(runner: Runner, tokenizer: Tokenizer, prompts: list[list[int]],
                   params: SamplingParams) -> list[list[int]]:
    """Decode several prompts together, one runner step per iteration; each finishes on its
    own. Returns the generated token ids per prompt."""
    seqs: list[Sequence] = [runner.add(p) for p in prompts]
    decs = [Decoding(tokenizer, params) for _ in prompts]
    out: list[list[int]] = [[] for _ in prompts]
    live = list(range(len(prompts)))
    try:
        while live:
            work = [(seqs[i], len(seqs[i].tokens) - seqs[i].num_computed) for i in live]
            logits = runner.step(work)
            still = []
            for row, i in enumerate(live):
                ev = decs[i].accept(logits[row])
                out[i].append(ev.token)
                if not ev.finish_reason:
                    seqs[i].tokens.append(ev.token)
                    still.append(i)
            live = still
    finally:
        for s in seqs:
            runner.release(s)
    return out

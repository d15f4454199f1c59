"""One sequence's per-token rules: sample, detokenize, stop on EOS, stop strings or
max_tokens. The engine (daemon/engine.py) keeps one Decoding per running request."""

from __future__ import annotations

from dataclasses import dataclass

from ckptd.model.sampling.sampler import Sampled, Sampler, SamplingParams
from ckptd.model.sequence import FinishReason
from ckptd.model.text.tokenizer import StreamDecoder, Tokenizer


@dataclass
class TokenEvent:
    token: int
    text: str                      # text delta (never a partial character or stop string)
    sampled: Sampled
    finish_reason: FinishReason | None = None   # STOP (EOS, stop token or string), LENGTH


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

    def accept(self, logits, forced: int | None = None) -> TokenEvent:
        """Sample the next token from logits [vocab] and apply the stop rules (forced:
        Sampler's, for synthetic speculative acceptance)."""
        assert not self.finished, "accept after the sequence finished"
        return self.take(self.sampler(logits, forced))

    def take(self, s: Sampled) -> TokenEvent:
        """Apply the stop rules to a token this sequence's sampler chose (here, or batched
        on the device: backend.py)."""
        assert not self.finished, "take after the sequence finished"
        self.n += 1
        if s.token in self.stop_ids:
            return self._end(TokenEvent(s.token, self.stops.flush(), s, FinishReason.STOP))
        text, stopped = self.stops.feed(self.detok.push(s.token))
        if stopped:
            return self._end(TokenEvent(s.token, text, s, FinishReason.STOP))
        if self.n >= self.params.max_tokens:
            return self._end(TokenEvent(s.token, text + self.stops.flush(), s,
                                       FinishReason.LENGTH))
        if self.sampler.grammar_done:       # complete: only an end token could follow
            return self._end(TokenEvent(s.token, text + self.stops.flush() + self.detok.flush(),
                                       s, FinishReason.STOP))
        return TokenEvent(s.token, text, s)

    def _end(self, ev: TokenEvent) -> TokenEvent:
        self.finished = True
        return ev

"""The draft model: a small model with the target's vocabulary that proposes the next
few tokens greedily, for the target to verify in one step (llama.cpp's draft-simple).

The drafter keeps one sequence of its own per target sequence (its own runner, pages
and recurrent slots; nothing of it is cached) and follows the target's tokens: each
`propose` first computes what the target accepted since the last one, then drafts.
`settle` takes back what the target did not accept."""

from __future__ import annotations

from dataclasses import dataclass

from ckptd.model.runner import Mark, Runner
from ckptd.model.sequence import Sequence
from ckptd.model.speculative.params import DraftLimits
from ckptd.model.state import OutOfSlots

TOP_K = 10      # the draft's probability of a token is over its top 10 (llama.cpp's)
VOCAB_SLACK = 128   # vocabularies may differ in size by this much (llama.cpp's limit)


@dataclass(eq=False)
class _Track:
    seq: Sequence
    mark: Mark | None = None      # where the last draft started
    drafted: int = 0              # tokens proposed by the last draft


class Drafter:
    def __init__(self, model, num_pages: int, num_slots: int, block_size: int = 16,
                 step_tokens: int = 256, max_seq_pages: int | None = None) -> None:
        self.runner = Runner(model, num_pages, num_slots, block_size,
                             max_batch_tokens=step_tokens, max_seq_pages=max_seq_pages)
        self.B, self.step_tokens = block_size, step_tokens
        self.free = list(range(num_pages - 1, -1, -1))
        self.tracks: dict[int, _Track] = {}

    def propose(self, key: int, tokens: list[int], limits: DraftLimits) -> list[int]:
        """Up to limits.n_max tokens to follow `tokens` (the target's, its last one not
        computed yet), each the draft's most likely, stopping at one it gives less than
        p_min; [] when shorter than n_min, or while the draft still catches up with a
        long prompt (step_tokens a call), or has no room."""
        t = self.tracks.get(key)
        if t is None:
            seq = Sequence([])
            try:
                self.runner.attach(seq)
            except OutOfSlots:
                return []
            t = self.tracks[key] = _Track(seq)
        seq = t.seq
        new = tokens[seq.num_computed:]
        if new and max(new) >= self.runner.vocab_size:    # an id only the model has
            self.release(key)
            return []
        del seq.tokens[seq.num_computed:]
        seq.tokens += new
        todo = len(tokens) - seq.num_computed
        if todo <= 0:           # never left so (settle keeps one token to compute): anew
            self.release(key)
            return []
        if todo > self.step_tokens:                  # a long prompt: part of it this step
            if self._grow(seq, seq.num_computed + self.step_tokens):
                self.runner.step([(seq, self.step_tokens)])
            return []
        if not self._grow(seq, len(tokens) + limits.n_max):
            return []
        logits = self.runner.step([(seq, todo)])[0]
        t.mark = self.runner.mark(seq)
        out: list[int] = []
        while len(out) < limits.n_max:
            top = logits.topk(min(TOP_K, logits.numel()))
            p = float(top.values.softmax(-1)[0])
            if p < limits.p_min:
                break
            out.append(int(top.indices[0]))
            if len(out) == limits.n_max:
                break
            seq.tokens.append(out[-1])
            logits = self.runner.step([(seq, 1)])[0]
        t.drafted = len(out)
        return out if len(out) >= max(limits.n_min, 1) else []

    def settle(self, key: int, kept: int) -> None:
        """The target kept `kept` of the last draft's tokens: the draft's state goes back
        to the last of them it computed (a hybrid's to where the draft started: the
        next propose computes the kept ones with the target's next token)."""
        t = self.tracks.get(key)
        if t is None or t.mark is None:
            return
        seq, mark = t.seq, t.mark
        valid = mark.position + min(kept, max(t.drafted - 1, 0))
        if valid < seq.num_computed:
            self.runner.rewind(seq, mark, mark.position if mark.conv is not None else valid)
        del seq.tokens[seq.num_computed:]
        t.mark, t.drafted = None, 0

    def release(self, key: int) -> None:
        """The target sequence ended: its draft's pages and slot go back."""
        t = self.tracks.pop(key, None)
        if t is not None:
            self.free += t.seq.pages
            t.seq.pages = []
            self.runner.detach(t.seq)

    def _grow(self, seq: Sequence, end: int) -> bool:
        """Pages for the first `end` tokens; False (holding what it had) when none are left."""
        need = -(-end // self.B) - len(seq.pages)
        if need > len(self.free):
            return False
        for _ in range(max(need, 0)):
            seq.pages.append(self.free.pop())
        return True


def check_vocab(target_tok, draft_tok, target_vocab: int, draft_vocab: int) -> None:
    """ValueError (one line) unless the draft's vocabulary is the target's: sizes within
    VOCAB_SLACK, the same begin and end tokens, and the same token for every id both have."""
    if abs(target_vocab - draft_vocab) > VOCAB_SLACK:
        raise ValueError(f"--model-draft: its vocabulary ({draft_vocab} tokens) is not the "
                         f"model's ({target_vocab})")
    if (target_tok.bos_id, target_tok.eos_id) != (draft_tok.bos_id, draft_tok.eos_id):
        raise ValueError("--model-draft: its begin/end tokens differ from the model's")
    a, b = target_tok.tok.get_vocab(), draft_tok.tok.get_vocab()
    by_id = {i: s for s, i in b.items()}
    n = min(len(a), len(b))
    for s, i in a.items():
        if i < n and by_id.get(i) != s:
            raise ValueError(f"--model-draft: token {i} is {by_id.get(i)!r} in the draft, "
                             f"{s!r} in the model: not the same vocabulary")
